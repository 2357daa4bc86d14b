"""What workers publish about their KV pools (descriptors), as msgpack: never pickle. Tensor-free."""
from __future__ import annotations

import msgpack


class TransferError(RuntimeError):
    pass


def pack(record: dict) -> bytes:
    """msgpack, never pickle: descriptors and metadata hold only ints, strings, bytes, lists and maps."""
    return msgpack.packb(record, use_bin_type=True)


def unpack(blob: bytes | memoryview, what: str, required: tuple[str, ...] = ()) -> dict:
    try:
        record = msgpack.unpackb(blob, raw=False, strict_map_key=True)
    except Exception as e:
        raise TransferError(f"{what}: not msgpack ({type(e).__name__})") from None
    if type(record) is not dict:
        raise TransferError(f"{what}: expected a map")
    missing = [k for k in required if k not in record]
    if missing:
        raise TransferError(f"{what}: missing {', '.join(missing)}")
    return record


def pack_descriptors(descriptors: dict[str, bytes]) -> bytes:
    """All of a worker's transport descriptors, as its hello's `kv_descriptor`: {name: bytes} in msgpack."""
    return pack({k: v for k, v in descriptors.items() if v})


def unpack_descriptors(blob: bytes) -> dict[str, bytes]:
    return unpack(blob, "kv_descriptor") if blob else {}
