"""Stop 44 (issue 20): the host's work in one decode launch, by part, at batch BATCH of Qwen3-0.6B (CUDA graphs,
context 1,024, warm): STEPS engine steps, each part of `ModelRunner.launch` timed on the host with perf_counter
(a launch queues GPU work and returns, so its wall time is host work). Parts that a tree lacks are left out, so
the same script times an older tree (.ab/old) beside this one. Prints the step time, each part's mean in us, and the
GPU's span a step (CUDA events from before the forward is queued to the tokens' copy).

Run from a tree's root on the GPU host: python docs/gpu_runs/stop44_launch_host.py [BATCH] [STEPS]
"""
from __future__ import annotations

import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path.cwd()))
import common.engine.model_runner as mr  # noqa: E402
from common.engine.in_flight import InFlight  # noqa: E402
from common.sampling_params import SamplingParams  # noqa: E402
from scripts.bench_engine import make_llm, model_dir  # noqa: E402
from scripts.bench_gpu import sync_time  # noqa: E402

spent: dict[str, float] = defaultdict(float)


def timed(name: str, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - t0
    return wrapper


def instrument(runner) -> None:
    cls = type(runner)
    for name in ("launch", "pack", "_sampling_batch", "_sample", "execute"):
        if hasattr(cls, name):
            setattr(runner, name, timed(name, getattr(runner, name)))
    mr.upload = timed("upload", mr.upload)
    mr.sample = timed("sample (eager)", mr.sample)
    mr.unpack_step = timed("unpack_step", mr.unpack_step)
    InFlight.mark = staticmethod(timed("InFlight.mark", InFlight.mark))
    InFlight.start = classmethod(timed("InFlight.start", InFlight.start.__func__))
    tokens = InFlight.tokens

    def gpu_timed(self, *args, **kwargs):  # the step's GPU span, read off its events once its tokens are in
        out = tokens(self, *args, **kwargs)
        spent["GPU span (events)"] += self.gpu_seconds() or 0.0
        return out
    InFlight.tokens = gpu_timed
    for attr in ("graphs", "sampler_graphs"):
        if getattr(runner, attr, None) is not None:
            graphs = getattr(runner, attr)
            graphs.replay = timed(f"{attr}.replay", graphs.replay)


def main() -> None:
    batch = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    with tempfile.TemporaryDirectory() as root:
        llm = make_llm(model_dir("qwen3-0.6b", Path(root)), max_num_seqs=64, max_model_len=1024 + steps + 64)
        engine = llm.engine
        for i in range(batch):
            engine.add_request(f"b{i}", list(range(1 + i, 1025 + i)),
                               SamplingParams(max_tokens=steps + 16, ignore_eos=True))
        for _ in range(8):  # the prompts, then a few decodes
            engine.step()
        instrument(engine.runner)
        spent.clear()
        t0 = sync_time()
        for _ in range(steps):
            engine.step()
        wall = sync_time() - t0
        print(f"batch {batch}: {wall / steps * 1e3:.3f} ms a step over {steps} steps; host us a step:", flush=True)
        for name, s in sorted(spent.items(), key=lambda kv: -kv[1]):
            print(f"  {name:24s} {s / steps * 1e6:8.1f}")
        llm.close()


if __name__ == "__main__":
    main()
