"""Two-batch overlap (common/engine/two_batch.py): a decode step's two halves, run phase by phase, give what one
batch gives. The streams and graphs are the GPU test's (test_gpu_engine.py); here the halves' metadata and the
layer split into phases run on CPU, interleaved as the streams would issue them."""
from __future__ import annotations

import torch

from common.engine.context import forward_context
from common.engine.llm import LLM
from common.engine.step_inputs import unpack_step
from common.engine.two_batch import halve, phases
from common.sampling_params import SamplingParams


def decode_step(llm: LLM, prompt_lens: list[int]):
    engine = llm.engine
    for i, n in enumerate(prompt_lens):
        engine.add_request(f"r{i}", list(range(3, 3 + n)), SamplingParams(max_tokens=8, ignore_eos=True))
    sched = engine.scheduler
    while sched.waiting or any(s.num_uncomputed() > 1 for s in sched.running):
        engine.step()
    engine.step()
    step = engine.runner.pack(sched.schedule())
    return unpack_step(step.header, step.payload)


def test_two_halves_phase_by_phase_equal_one_batch(tiny_qwen3_dir):
    llm = LLM(str(tiny_qwen3_dir), device="cpu", kv_cache_memory=64 << 20, overlap_scheduling=False,
              enable_prefix_caching=False)
    try:
        inputs = decode_step(llm, [5, 9, 17, 3, 40, 7, 12])
        runner = llm.engine.runner
        md = runner.backend.prepare_metadata(inputs.attn)
        assert md.num_decodes == md.seq_lens.shape[0] == 7
        model = runner.model
        with torch.inference_mode():
            with forward_context(md):
                whole = model(inputs.input_ids, inputs.positions)
            first, second = halve(md)
            assert (first.num_decodes, second.num_decodes) == (3, 4)
            assert second.seq_lens.tolist() == md.seq_lens[3:].tolist()
            assert second.query_start_loc.tolist() == [0, 1, 2, 3, 4]
            x = model.model.embed_tokens(inputs.input_ids)
            out = torch.full_like(whole, float("nan"))
            chains = [phases(model.model, inputs.positions[a:b], x[a:b], h, out[a:b])
                      for (a, b), h in (((0, 3), first), ((3, 7), second))]
            n = 0
            for _ in zip(*chains):  # half 0's phase, then half 1's, as the two streams issue them
                n += 1
            assert n == 2 * len(model.model.layers) + 1
        torch.testing.assert_close(out, whole, rtol=1e-5, atol=1e-5)
    finally:
        llm.close()
