"""Kernel warm-up (common/engine/warmup.py): it runs every kind of step serving launches, through the real
scheduler, and leaves no trace. On CPU nothing is compiled, so what is checked here is the steps it runs; the
GPU test (test_gpu_engine.py) checks that no Triton variant is compiled after it."""
from __future__ import annotations

import pytest

from common.engine.compile_watch import CompileWatch
from common.engine.llm import LLM
from common.engine.scheduler import ScheduledBatch
from common.engine.warmup import warm_up
from common.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def llm(tiny_qwen3_dir):
    llm = LLM(str(tiny_qwen3_dir), device="cpu", max_model_len=512, block_size=16)
    yield llm
    llm.close()


def test_a_cpu_engine_runs_no_warmup(llm):
    assert llm.engine.warmup is None and llm.engine.totals.steps == 0


def test_warmup_runs_each_kind_of_step_and_leaves_no_trace(llm):
    engine = llm.engine
    steps: list[dict] = []
    launch = engine.runner.launch

    def record(batch: ScheduledBatch):
        nd = batch.num_decodes
        steps.append(dict(decodes=nd, seqs=len(batch.seqs), decode_only=batch.decode_only,
                          contexts=[s.num_computed_tokens + 1 for s in batch.seqs[:nd]],
                          prefills=[(s.num_computed_tokens, s.num_cached_tokens) for s in batch.seqs[nd:]],
                          sampling=[s.sampling for s in batch.seqs]))
        return launch(batch)

    engine.runner.launch = record
    try:
        report = warm_up(engine)
    finally:
        del engine.runner.launch
    assert any(s["decodes"] == 0 and all(c == 0 for c, _ in s["prefills"]) for s in steps), "a fresh prefill alone"
    # A prefill over cached prefix blocks in the same step as a decode whose context the plan splits.
    assert any(any(cached > 0 for _, cached in s["prefills"]) and max(s["contexts"], default=0) > 96 for s in steps)
    # Short decodes (one unit each) beside a new prefill.
    assert any(s["decodes"] >= 4 and 0 < max(s["contexts"]) < 96 and s["seqs"] > s["decodes"] for s in steps)
    assert any(s["decode_only"] for s in steps)
    kinds = {(p.temperature > 0, p.top_k > 0 or p.top_p < 1, p.seed is not None) for s in steps for p in s["sampling"]}
    assert {(False, False, False), (True, False, False), (True, True, False), (True, False, True)} <= kinds
    # The fused sampler's step: some rows sample with a temperature, none with top-k/top-p.
    assert any(any(p.temperature > 0 for p in s["sampling"])
               and all(p.top_k <= 0 and p.top_p == 1 for p in s["sampling"])
               for s in steps)
    # No trace: nothing queued or held, every block free, no cached prefix, no step counted.
    assert not engine.has_unfinished() and not engine.requests
    assert engine.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.block_manager.hash_to_block and engine.block_manager.cache_hit_tokens == 0
    assert engine.totals.steps == 0 and engine.load().busy_steps == 0
    assert report.variants == [] and report.seconds > 0  # the CPU engine launches no Triton kernel


def test_after_warmup_the_engine_serves_as_before(llm):
    prompt = [5, 6, 7, 8, 9, 10, 11]
    before = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    warm_up(llm.engine)
    after = llm.generate([prompt], SamplingParams(max_tokens=8, temperature=0.0), use_tqdm=False)[0]
    assert after.token_ids == before.token_ids and after.num_cached_tokens == 0


def test_compile_watch_restores_the_hook_it_chained_to():
    triton = pytest.importorskip("triton")
    seen = []

    def previous(*args, **kwargs):
        seen.append(kwargs.get("repr"))
        return None

    triton.knobs.runtime.jit_cache_hook = previous
    try:
        with CompileWatch() as watch:
            assert triton.knobs.runtime.jit_cache_hook == watch._hook
            watch._hook(repr="k[num_warps=4](x: *fp32)", compile={"signature": {"x": "*fp32", "N": "constexpr"},
                                                                  "configs": [{(0,): [["tt.divisibility", 16]]}]})
        assert triton.knobs.runtime.jit_cache_hook is previous
        assert watch.variants == ["k(x: *fp32) specialized {(0,): [['tt.divisibility', 16]]}"]
        assert seen == ["k[num_warps=4](x: *fp32)"]
    finally:
        triton.knobs.runtime.jit_cache_hook = None


def test_padded_prefill_steps_generate_what_unpadded_ones_do(llm):
    """On a GPU a step with prefills runs at a padded token count (step_inputs.padded_tokens); the padding tokens
    must change nothing a request sees. The CPU engine pads here on purpose, through the same pack_step."""

    from common.engine.step_inputs import pack_step
    from common.engine.step_sizes import padded_tokens

    prompts = [[5, 6, 7, 8, 9, 10, 11], list(range(20, 97)), [3] * 40]
    sampling = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    plain = [o.token_ids for o in llm.generate(prompts, sampling, use_tqdm=False)]
    runner = llm.engine.runner
    sizes = []

    def padded(batch):
        step = pack_step(batch, runner.config.block_size, runner._launches, runner._plan,
                         lambda n, decodes: padded_tokens(n, 512))
        sizes.append(step.header.num_tokens)
        return step

    runner.pack = padded
    try:
        assert [o.token_ids for o in llm.generate(prompts, sampling, use_tqdm=False)] == plain
    finally:
        del runner.pack
    prefills = [n for n in sizes if n > len(prompts)]  # decode-only steps (one token a sequence) are not padded
    assert prefills and set(prefills) <= {64, 128, 192, 256}
