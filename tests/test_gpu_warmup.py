"""No Triton compilation after an engine says it is ready (issue: the first minute as fast as the tenth).

Run on the GPU host: `python -m pytest tests/test_gpu_warmup.py -v`. After `LLM(...)` returns, a varied load
(ragged prompts of odd and even lengths, long and short contexts, cached prefixes, every sampling kind, arrivals
while others decode) must make Triton neither compile nor load a single kernel variant."""
from __future__ import annotations

import random

import pytest

from common.engine.compile_watch import CompileWatch
from common.engine.llm import LLM
from common.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu


def varied_load(llm: LLM, seed: int = 0) -> int:
    """Requests arriving in waves while earlier ones decode; returns the number of steps run."""
    rng = random.Random(seed)
    engine, vocab = llm.engine, llm.engine.config.model_config.vocab_size
    prefix = [rng.randrange(vocab) for _ in range(700)]
    kinds = [dict(temperature=0.0), dict(temperature=0.7), dict(temperature=0.9, top_p=0.8),
             dict(temperature=1.0, top_k=40), dict(temperature=0.8, seed=11), dict(temperature=0.6, top_p=0.9, seed=3)]
    steps = n = 0
    for wave in range(6):
        for _ in range(rng.randint(3, 12)):
            length = rng.choice([1, 2, 3, 15, 16, 17, 63, 64, 65, 127, 250, 511, 1023, 1500, 2900])
            ids = (prefix[:rng.choice([16, 300, 700])] if rng.random() < 0.4 else []) + \
                [rng.randrange(vocab) for _ in range(length)]
            sp = SamplingParams(max_tokens=rng.randint(1, 48), ignore_eos=True, **rng.choice(kinds))
            engine.add_request(f"load-{n}", ids, sp)
            n += 1
        for _ in range(rng.randint(1, 20)):
            if engine.has_unfinished():
                engine.step()
                steps += 1
    while engine.has_unfinished():
        engine.step()
        steps += 1
    return steps


def forget_loaded_variants() -> None:
    """Drop the kernel variants this process holds in memory, as a fresh worker process starts: the next launch of
    each goes through Triton's cache hook again (and compiles, or loads from disk)."""
    import triton

    from common.engine.attention import triton_ops
    from common.engine.layers import fused
    from common.engine.layers import gemv, splitk
    for module in (triton_ops, fused, gemv, splitk):
        for fn in vars(module).values():
            if isinstance(fn, triton.runtime.jit.JITFunction):
                fn.device_caches.clear()


@pytest.mark.parametrize("eager", [False, True], ids=["graphs", "eager"])
def test_no_kernel_variant_is_compiled_after_ready(qwen3_06b_dir, eager):
    forget_loaded_variants()
    # Graph capture makes most variants ready, warm-up the rest (with graphs it may find none left)
    with CompileWatch() as start:
        llm = LLM(str(qwen3_06b_dir), device="cuda", dtype="bfloat16", load_format="dummy", max_model_len=4096,
                  gpu_memory_utilization=0.3, enforce_eager=eager, attention_backend="triton")
    try:
        assert llm.engine.warmup is not None
        assert start.variants, "the watch sees the engine's start make the kernels ready"
        with CompileWatch() as watch:
            steps = varied_load(llm)
        assert steps > 20
        assert watch.variants == [], f"compiled after ready: {watch.variants}"
        assert llm.engine.num_free_blocks == llm.engine.block_manager.num_blocks
    finally:
        llm.close()
