"""A request's life at the router (router/request.py): transitions refuse the wrong phase, and whatever path a
request takes, the workers' counts (prompt tokens to prefill, requests assigned) come back to zero."""
from __future__ import annotations

import itertools

import pytest

from common import protocol as P
from common.sampling_params import SamplingParams
from router.registry import WorkerInfo
from router.request import IllegalTransition, Phase, Request

LAYOUT = P.KVLayout(block_size=16, num_layers=2, num_kv_heads=2, head_dim=32, dtype="float32")
_ids = itertools.count()


def worker(name: str, role: str) -> WorkerInfo:
    hello = P.WorkerHello(worker_id=name, role=role, model_fingerprint="m", num_blocks=64, layout=LAYOUT,
                          max_model_len=256, vocab_size=512)
    load = P.WorkerLoad(queued_requests=0, queued_tokens=0, running_requests=0, kv_blocks_total=64,
                        kv_blocks_free=64)
    return WorkerInfo(hello, name.encode(), load)


def request(prompt_len: int = 20) -> Request:
    return Request(f"r{next(_ids)}", b"client", "c", [1] * prompt_len, SamplingParams(), False, detok=None)


def idle(*workers: WorkerInfo) -> bool:
    return all(w.prefill_tokens == 0 and not w.assigned for w in workers)


@pytest.fixture
def workers():
    return worker("p0", "prefill"), worker("p1", "prefill"), worker("d0", "decode"), worker("c0", "colocated")


def test_a_disaggregated_request_from_queue_to_end(workers):
    p0, _, d0, _ = workers
    req = request(20)
    req.pair(p0, d0, blocks=2)
    assert req.phase is Phase.RESERVING and req.dispatched is not None
    assert (p0.prefill_tokens, d0.blocks_promised) == (20, 2) and req.rid in p0.assigned and req.rid in d0.assigned
    req.reserved(p0)
    assert req.phase is Phase.PREFILLING and p0.prefill_tokens == 20
    req.first_token()
    assert req.phase is Phase.DECODING and req.prefilled_on == "p0"
    assert idle(p0) and req.rid in d0.assigned and req.workers == [d0]
    req.end()
    assert req.phase is Phase.DONE and idle(*workers)


def test_a_colocated_request_counts_its_prompt_until_the_first_token(workers):
    *_, c0 = workers
    req = request(7)
    req.run_on(c0)
    assert req.phase is Phase.RUNNING and c0.prefill_tokens == 7 and req.rid in c0.assigned
    req.first_token()
    assert req.phase is Phase.RUNNING and c0.prefill_tokens == 0 and req.rid in c0.assigned
    req.end()
    assert idle(c0)


def test_the_prefill_worker_changes_when_the_first_stops_accepting(workers):
    p0, p1, d0, _ = workers
    req = request(10)
    req.pair(p0, d0, blocks=1)
    req.reserved(p1)
    assert idle(p0) and p1.prefill_tokens == 10 and req.rid in p1.assigned and req.prefill is p1
    req.first_token()
    assert idle(p0, p1) and req.prefilled_on == "p1"


@pytest.mark.parametrize("path", ["reserving", "prefilling", "decoding", "running"])
def test_requeue_and_end_release_everything_from_any_phase(workers, path):
    p0, _, d0, c0 = workers
    for finish in ("requeue", "end"):
        req = request(12)
        if path == "running":
            req.run_on(c0)
        else:
            req.pair(p0, d0, blocks=1)
            if path in ("prefilling", "decoding"):
                req.reserved(p0)
            if path == "decoding":
                req.first_token()
        getattr(req, finish)()
        assert idle(*workers), (path, finish)
        assert req.phase is (Phase.QUEUED if finish == "requeue" else Phase.DONE)
        assert req.workers == [] and (req.dispatched is None) == (finish == "requeue")
    req.end()  # ending twice changes nothing
    assert idle(*workers)


def test_transitions_refuse_the_wrong_phase(workers):
    p0, _, d0, c0 = workers
    req = request()
    for illegal in (lambda: req.reserved(p0), req.first_token, req.requeue):
        with pytest.raises(IllegalTransition, match="is queued"):
            illegal()
    req.pair(p0, d0, blocks=1)
    with pytest.raises(IllegalTransition, match="is reserving, not queued"):
        req.run_on(c0)
    with pytest.raises(IllegalTransition):
        req.first_token()  # the KV is not even on its way
    assert req.phase is Phase.RESERVING and p0.prefill_tokens == 20  # unchanged by the refused transitions
    req.end()
    with pytest.raises(IllegalTransition, match="is done"):
        req.requeue()
    assert idle(*workers)


def test_restart_releases_the_old_attempt_and_starts_a_fresh_one_under_a_new_id(workers):
    p0, _, d0, _ = workers
    req = request(12)
    req.pair(p0, d0, blocks=1)
    req.reserved(p0)
    req.first_token()
    req.token_ids, req.token_times, req.cached_tokens = [5, 6], [1.0, 2.0], 4
    old = req.rid
    req.restart("fresh", detok="new detokenizer")
    assert idle(*workers) and old not in d0.assigned  # released under the id the workers knew
    assert (req.rid, req.attempts, req.phase) == ("fresh", 1, Phase.QUEUED)
    assert (req.token_ids, req.token_times, req.cached_tokens, req.prefilled_on) == ([], [], 0, "")
    assert req.detok == "new detokenizer"
    req.pair(p0, d0, blocks=1)
    assert "fresh" in p0.assigned and "fresh" in d0.assigned
    req.end()
    with pytest.raises(IllegalTransition, match="is done"):
        req.restart("again", detok=None)


def test_migrate_keeps_the_stream_and_resumes_after_it(workers):
    p0, p1, d0, _ = workers
    req = Request("first", b"client", "c", [1] * 12, SamplingParams(max_tokens=10, seed=3), True, detok="kept")
    req.pair(p0, d0, blocks=1)
    req.reserved(p0)
    assert req.awaiting_first_token
    req.first_token()
    req.token_ids, req.token_times, req.cached_tokens = [5, 6, 7], [1.0, 2.0, 3.0], 4
    assert not req.awaiting_first_token
    req.migrate("moved")
    assert idle(*workers) and "first" not in d0.assigned
    assert (req.rid, req.migrations, req.attempts, req.phase) == ("moved", 1, 0, Phase.QUEUED)
    assert req.token_ids == [5, 6, 7] and req.detok == "kept" and req.cached_tokens == 4  # the client's, kept
    assert req.attempt_ids == [1] * 12 + [5, 6, 7] and req.prompt_ids == [1] * 12
    assert req.attempt_sampling == SamplingParams(max_tokens=7, seed=3)  # only the tokens still to come
    req.pair(p1, d0, blocks=1, cached=8)
    assert p1.prefill_tokens == 15 - 8  # what its cache is not reckoned to hold
    req.reserved(p1)
    assert req.awaiting_first_token  # the next token ends this attempt's prefill
    req.first_token()
    assert idle(p0, p1)
    req.end()
    assert idle(*workers)
    req2 = request(12)
    req2.run_on(workers[3])
    req2.token_ids = [9]
    req2.migrate("x")
    req2.run_on(workers[3])
    req2.restart("y", detok=None)  # a restart starts from nothing
    assert (req2.attempt_ids, req2.resumed_at, req2.attempt_sampling) == ([1] * 12, 0, SamplingParams())
