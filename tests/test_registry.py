"""The worker registry's roster (router/registry.py): what admission and placement read per request is kept, not
recomputed per request, and follows every change of who is accepting: a join, a death, a return, a drain, a
removal, a restart with other limits; and who may join at all."""
from __future__ import annotations

import msgspec
import pytest

from common import protocol as P
from router.registry import WorkerRegistry

LAYOUT = P.KVLayout(block_size=16, num_layers=1, num_kv_heads=1, head_dim=8, dtype="float32")


def hello(worker_id: str, role: str, num_blocks: int = 64, max_model_len: int = 256) -> P.WorkerHello:
    return P.WorkerHello(worker_id=worker_id, role=role, model_fingerprint="f", num_blocks=num_blocks, layout=LAYOUT,
                         max_model_len=max_model_len, vocab_size=512)


def ids(workers) -> list[str]:
    return [w.worker_id for w in workers]


def test_the_roster_is_kept_between_changes_and_follows_each_one():
    reg = WorkerRegistry(max_requests=2)
    assert reg.limits() is None and not reg.can_serve("disagg") and reg.largest_blocks("decode") == 0
    p0 = reg.register(hello("p0", "prefill"), b"p0")
    d0 = reg.register(hello("d0", "decode", num_blocks=64), b"d0")
    d1 = reg.register(hello("d1", "decode", num_blocks=128, max_model_len=128), b"d1")
    roster = reg.roster()
    assert reg.roster() is roster  # nothing changed: not rebuilt
    assert reg.can_serve("disagg") and not reg.can_serve("colocated")
    assert ids(reg.of_role("decode")) == ["d0", "d1"] and ids(reg.of_role("prefill", "decode")) == ["p0", "d0", "d1"]
    assert reg.limits() == (128, 512) and reg.largest_blocks("decode") == 128

    d0.assigned.update({"a", "b"})  # full: out of with_room at once (requests come and go without a rebuild)
    assert ids(reg.with_room("decode")) == ["d1"] and reg.roster() is roster
    d0.assigned.clear()

    d1.alive = False  # declared dead
    assert reg.roster() is not roster
    assert ids(reg.of_role("decode")) == ["d0"] and reg.limits() == (256, 512) and reg.largest_blocks("decode") == 64
    d1.alive = True  # heard from again
    assert ids(reg.of_role("decode")) == ["d0", "d1"] and reg.largest_blocks("decode") == 128

    d0.draining = True
    d1.draining = True
    assert reg.of_role("decode") == [] and not reg.can_serve("disagg") and reg.limits() == (256, 512)
    d0.draining = False
    reg.forget("d1")
    assert ids(reg.of_role("decode")) == ["d0"] and reg.can_serve("disagg")

    reg.register(hello("p0", "prefill", max_model_len=64), b"p0-new")  # restarted with other limits
    assert reg.limits() == (64, 512) and reg.of_role("prefill")[0] is not p0
    p0.alive = False  # the old record's changes still reach the registry; the new record stands
    assert ids(reg.of_role("prefill")) == ["p0"] and reg.of_role("prefill")[0].alive


def test_callers_get_their_own_lists():
    reg = WorkerRegistry()
    reg.register(hello("c0", "colocated"), b"c0")
    reg.of_role("colocated").clear()
    reg.with_room("colocated").clear()
    assert ids(reg.of_role("colocated")) == ["c0"]


def test_a_worker_of_another_model_or_kv_layout_is_refused_at_its_hello() -> None:
    """Fail fast on mismatch: a handoff between workers of other models or KV layouts would land garbage, so the
    router's handshake refuses the newcomer naming what differs, and the workers already there stay."""
    reg = WorkerRegistry()
    reg.register(hello("p0", "prefill"), b"p0")
    other_model = msgspec.structs.replace(hello("d0", "decode"), model_fingerprint="g")
    with pytest.raises(ValueError, match="model mismatch: d0 serves g, p0 serves f"):
        reg.register(other_model, b"d0")
    other_layout = msgspec.structs.replace(hello("d0", "decode"), layout=msgspec.structs.replace(LAYOUT, block_size=32))
    with pytest.raises(ValueError, match="KV layout mismatch: d0 has .*block_size=32.*, p0 has .*block_size=16"):
        reg.register(other_layout, b"d0")
    assert ids(reg.of_role("prefill")) == ["p0"] and reg.of_role("decode") == [] and not reg.can_serve("disagg")
    reg.register(hello("d0", "decode"), b"d0")  # the same model and layout join
    assert reg.can_serve("disagg")
