"""Stop 44 (issue 20): the sampler graphs and the one-slice PENDING copy against the paths they replace, in one
process, so that the host's speed, which moves by a third from one process to the next (docs/benchmarks.md, stop
44), is the same for every mode. Qwen3-0.6B, CUDA graphs, warm; for each mode in turn, ROUNDS times: BATCH fresh
requests of 1,024 prompt tokens (the prefix cache serves their prompts after the first round), 8 steps, then STEPS
timed decode steps (context 1,032 to 1,032 + STEPS), then the requests are aborted. Prints each mode's step time and
`ModelRunner.launch`'s host time (perf_counter), median and range over the rounds.

Modes: `new` (this tree); `eager sampler` (no sampler graphs: the LM head and the sampler run eagerly, as before);
`indexed pending` (PENDING inputs through the uploaded index pair, a gather and a scatter, as before); `both old`.

Run from the repository root on the GPU host: python docs/gpu_runs/stop44_launch_ab.py [BATCH] [STEPS] [ROUNDS]
"""
from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
from common.engine.step_inputs import PendingRows  # noqa: E402
from common.sampling_params import SamplingParams  # noqa: E402
from scripts.bench_engine import make_llm, model_dir  # noqa: E402
from scripts.bench_gpu import sync_time  # noqa: E402

MODES = {"new": (True, True), "eager sampler": (False, True), "indexed pending": (True, False),
         "both old": (False, False)}


def main() -> None:
    batch, steps, rounds = ([int(a) for a in sys.argv[1:]] + [1, 500, 4][len(sys.argv) - 1:])[:3]
    with tempfile.TemporaryDirectory() as root:
        llm = make_llm(model_dir("qwen3-0.6b", Path(root)), max_num_seqs=64, max_model_len=1024 + steps + 64)
        engine, runner = llm.engine, llm.engine.runner
        samplers, run = runner.sampler_graphs, PendingRows.run
        spent = [0.0]
        launch = runner.launch

        def timed(b):
            t0 = time.perf_counter()
            try:
                return launch(b)
            finally:
                spent[0] += time.perf_counter() - t0
        runner.launch = timed
        results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
        for r in range(rounds):
            for mode, (graphs, slice_copy) in MODES.items():
                runner.sampler_graphs = samplers if graphs else None
                PendingRows.run = run if slice_copy else (lambda self: None)
                ids = [f"{mode}-{r}-{i}" for i in range(batch)]
                for i, rid in enumerate(ids):
                    engine.add_request(rid, list(range(1 + i, 1025 + i)),
                                       SamplingParams(max_tokens=steps + 64, ignore_eos=True))
                for _ in range(8):
                    engine.step()
                spent[0] = 0.0
                t0 = sync_time()
                for _ in range(steps):
                    engine.step()
                wall = sync_time() - t0
                results[mode].append((wall / steps * 1e3, spent[0] / steps * 1e6))
                for rid in ids:
                    engine.abort(rid)
                while engine.has_unfinished():
                    engine.step()
        print(f"batch {batch}, {steps} steps, {rounds} rounds: ms a step | launch host us a step "
              "(median, min-max)", flush=True)
        for mode, rows in results.items():
            ms, us = [m for m, _ in rows], [u for _, u in rows]
            print(f"  {mode:16s} {statistics.median(ms):.3f} ({min(ms):.3f}-{max(ms):.3f}) | "
                  f"{statistics.median(us):7.1f} ({min(us):.1f}-{max(us):.1f})")
        llm.close()


if __name__ == "__main__":
    main()
