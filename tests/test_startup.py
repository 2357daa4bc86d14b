"""How long starting took, by phase (common/startup.py): what an engine records and a cluster logs."""
from __future__ import annotations

import time
from concurrent.futures import Future

import pytest

from common.engine.llm import LLM
from common.prompt import load_tokenizer, tokenizer_loading
from common.startup import Startup
from router.config import RouterConfig
from router.router import Router
from router.text import RouterText
from tests.cluster_harness import free_port


def test_phases_add_up_in_the_order_they_ran():
    startup = Startup()
    with startup.timed("model"):
        time.sleep(0.02)
    startup.add("KV pool", 0.5)
    startup.add("model", 1.0)  # timed twice: the two add up
    startup.add("clock skew", -0.3)  # a negative span counts as none
    assert list(startup.phases) == ["model", "KV pool", "clock skew"]
    assert startup.phases["model"] == pytest.approx(1.02, abs=0.05)
    assert startup.phases["clock skew"] == 0.0
    assert startup.seconds == pytest.approx(sum(startup.phases.values()))
    assert startup.summary() == (f"{startup.seconds:.1f} s (model {startup.phases['model']:.1f} s, KV pool 0.5 s, "
                                 f"clock skew 0.0 s)")


def test_extend_adds_another_startups_phases_after_its_own():
    first, second = Startup({"imports": 1.0}), Startup({"model": 2.0, "imports": 0.5})
    first.extend(second)
    assert first.phases == {"imports": 1.5, "model": 2.0}
    assert Startup().summary() == "0.0 s"


def test_an_engine_times_loading_its_model_and_its_kv_pool(tiny_qwen3_dir):
    before = time.monotonic()
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20)
    took = time.monotonic() - before
    try:
        phases = llm.engine.startup.phases
        # On a CPU there are no CUDA graphs to capture and no kernel warm-up.
        assert list(phases) == ["model", "KV pool"]
        assert all(seconds > 0 for seconds in phases.values())
        assert llm.engine.startup.seconds <= took
    finally:
        llm.close()


def test_a_tokenizer_loading_on_its_thread_is_the_one_loaded_at_once(tiny_qwen3_dir):
    pending = tokenizer_loading(tiny_qwen3_dir)
    text, now = RouterText(pending), RouterText.load(tiny_qwen3_dir)
    ids = now.tokenizer.encode("The capital of France is")
    assert text.tokenizer.encode("The capital of France is") == ids and pending.done()
    assert text.decode(ids) == now.decode(ids) == "The capital of France is"


def test_a_router_takes_its_tokenizer_still_loading_and_waits_for_it_only_to_tokenize(tiny_qwen3_dir):
    pending: Future = Future()
    router = Router(RouterConfig(model=str(tiny_qwen3_dir), bind=f"tcp://127.0.0.1:{free_port()}"), RouterText(pending))
    try:
        assert not pending.done()  # built, its sockets bound, without the tokenizer
        pending.set_result(load_tokenizer(tiny_qwen3_dir))
        assert router.text.decode(router.text.tokenizer.encode("Hello")) == "Hello"
    finally:
        router.close()


def test_a_tokenizer_that_failed_to_load_says_why_at_every_read():
    failed: Future = Future()
    failed.set_exception(ValueError("tokenizer: cannot load it"))
    text = RouterText(failed)
    for _ in range(2):  # a failure is not kept as the tokenizer
        with pytest.raises(ValueError, match="cannot load it"):
            text.tokenizer
