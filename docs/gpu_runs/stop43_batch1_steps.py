"""Stop 43 (issue 20): batch-1 decode steps of Qwen3-0.6B (CUDA graphs, context 1,024, warm) run long enough for a
sampling profiler to see where the host's time a step goes: STEPS steps (default 3,000) of one sequence, the mean
step time printed. Run under py-spy on the GPU host, then sum the profile there with docs/gpu_runs/spy_summary.py
(frame `LLMEngine.step`).

Run: py-spy record -r 250 -f raw -o /tmp/b1.txt -- python docs/gpu_runs/stop43_batch1_steps.py [STEPS]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from common.sampling_params import SamplingParams  # noqa: E402
from scripts.bench_engine import make_llm, model_dir  # noqa: E402
from scripts.bench_gpu import sync_time  # noqa: E402


def main() -> None:
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    with tempfile.TemporaryDirectory() as root:
        llm = make_llm(model_dir("qwen3-0.6b", Path(root)), max_num_seqs=64, max_model_len=1024 + steps + 64)
        engine = llm.engine
        engine.add_request("b1", list(range(1, 1025)), SamplingParams(max_tokens=steps + 16, ignore_eos=True))
        for _ in range(8):  # the prompt, then a few decodes
            engine.step()
        t0 = sync_time()
        for _ in range(steps):
            engine.step()
        print(f"batch 1: {(sync_time() - t0) / steps * 1e3:.3f} ms a step over {steps} steps", flush=True)
        llm.close()


if __name__ == "__main__":
    main()
