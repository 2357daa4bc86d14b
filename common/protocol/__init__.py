"""The pdcluster wire protocol: every record that crosses a socket, typed, versioned and validated at the boundary.

A record is one msgpack map in one ZMQ frame: `{"v": 1, "type": <name>, **fields}`. Each message type is a msgspec
struct (`client.py`: clients <-> router; `cluster.py`: router <-> workers and the KV data plane), built from the
records of `records.py` and `kv.py` in the grammar of `schema.py`; `codec.py` encodes and decodes. docs/protocol.md
describes the same thing in prose, and tests/test_protocol.py keeps the two in sync.
"""
from common.protocol.client import (
    MAX_STOP_STRINGS, Abort, Delta, Error, Ping, Pong, Result, Sampling, ScaleReply, ScaleRequest, Stats, StatsRequest,
    Submit,
)
from common.protocol.cluster import (
    AbortRequest, Alive, GenerateTask, HandoffAck, Heartbeat, KVHandoff, KVLinkOpen, LinkOpened, OpenLink, PrefillTask,
    Reserve, Reserved, Shutdown, TokenBatch, WorkerHello, liveness_identity,
)
from common.protocol.codec import checked, decode, encode, field_problem, prepare
from common.protocol.errors import (
    ABORTED, BAD_REQUEST, ERROR_CODES, INTERNAL, NOT_FOUND, OVERLOADED, TIMEOUT, TOO_LARGE, UNAUTHORIZED,
    UNAVAILABLE, UNKNOWN_TYPE, UNSUPPORTED_VERSION, ProtocolError,
)
from common.protocol.kv import (
    TRANSPORT_NAMES, CudaIpcDescriptor, CudaIpcPool, KVDescriptors, KVLayout, NcclDescriptor, NcclStream,
)
from common.protocol.records import RouterTotals, Timings, TokenUpdate, TransportTotals, Usage, WorkerLoad, WorkerStats
from common.protocol.schema import (
    FINISH_REASONS, MAX_FRAME_BYTES, MAX_ID_LEN, MAX_LIST_LEN, MAX_MESSAGE_LEN, MAX_SCALE_DELTA, MAX_STR_LEN,
    MAX_TOKEN_ID, PROTOCOL_VERSION, REGISTRY, ROLES, Message, Record,
)

DEFAULT_ROUTER_ADDRESS = "tcp://127.0.0.1:5555"

prepare()  # every message type is defined now: the decoder is built at import, not on a process's first frame

# What each socket accepts, for `decode(frame, expect=...)`.
CLIENT_TO_ROUTER = (Submit, Abort, Ping, Pong, StatsRequest, ScaleRequest)
ROUTER_TO_CLIENT = (Delta, Result, Error, Ping, Pong, Stats, ScaleReply)
WORKER_TO_ROUTER = (WorkerHello, Reserved, TokenBatch, Heartbeat, Alive, HandoffAck, LinkOpened, Error, Ping, Pong)
ROUTER_TO_WORKER = (Reserve, PrefillTask, GenerateTask, OpenLink, AbortRequest, Shutdown, Ping, Pong)
DATA_PLANE = (KVHandoff, HandoffAck, KVLinkOpen)


def error_reply(exc: ProtocolError, retry_after: float | None = None) -> Error:
    """The `error` to send back to the peer whose frame raised `exc`."""
    return Error(request_id=exc.request_id, code=exc.code, message=exc.message[:MAX_MESSAGE_LEN],
                 retry_after=retry_after)


__all__ = [
    "PROTOCOL_VERSION", "DEFAULT_ROUTER_ADDRESS", "MAX_STOP_STRINGS", "MAX_FRAME_BYTES", "MAX_LIST_LEN", "MAX_STR_LEN",
    "MAX_ID_LEN", "MAX_MESSAGE_LEN", "MAX_TOKEN_ID", "MAX_SCALE_DELTA", "ROLES", "FINISH_REASONS", "TRANSPORT_NAMES",
    "BAD_REQUEST", "UNSUPPORTED_VERSION", "UNKNOWN_TYPE", "TOO_LARGE", "NOT_FOUND", "OVERLOADED", "UNAVAILABLE",
    "TIMEOUT", "ABORTED", "UNAUTHORIZED", "INTERNAL", "ERROR_CODES", "ProtocolError", "error_reply",
    "Record", "Message", "REGISTRY", "encode", "decode", "checked", "field_problem",
    "Sampling", "Usage", "Timings", "TransportTotals", "WorkerLoad", "WorkerStats", "TokenUpdate", "RouterTotals",
    "KVLayout", "KVDescriptors", "CudaIpcDescriptor", "CudaIpcPool", "NcclDescriptor", "NcclStream",
    "Submit", "Abort", "Ping", "Pong", "StatsRequest", "Stats", "ScaleRequest", "ScaleReply", "Delta", "Result",
    "Error", "WorkerHello", "Reserve", "Reserved", "PrefillTask", "GenerateTask", "KVHandoff", "HandoffAck",
    "OpenLink", "LinkOpened", "KVLinkOpen",
    "TokenBatch", "Heartbeat", "Alive", "liveness_identity", "AbortRequest", "Shutdown",
    "CLIENT_TO_ROUTER", "ROUTER_TO_CLIENT", "WORKER_TO_ROUTER", "ROUTER_TO_WORKER", "DATA_PLANE",
]
