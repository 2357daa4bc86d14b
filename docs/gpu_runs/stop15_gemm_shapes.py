"""Does a bf16 GEMM cost more the first time its M is seen? Qwen3-0.6B's projections (hidden 1024), 40 distinct M
in 20..2000: each timed the first time, then again; then 40 new M. Host time of the call (torch.cuda.synchronize
around it), which is what a prefill step pays."""
import random, statistics, time
import torch

rng = random.Random(0)
ms_ = rng.sample(range(20, 2000), 80)
w = [torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16) for n in (4096, 6144, 1024, 3072)]

def step(m):
    x = torch.randn(m, 1024, device="cuda", dtype=torch.bfloat16)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(28):  # layers
        for wi in w[:2]:
            y = torch.nn.functional.linear(x, wi)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3

step(64); step(128)
for name, ms in (("first time", ms_[:40]), ("same M again", ms_[:40]), ("new M", ms_[40:])):
    t = [step(m) for m in ms]
    print(f"{name:<14} median {statistics.median(t):.3f} ms  mean {statistics.mean(t):.3f} ms (56 GEMMs a step)")
