"""What an upper-bound grid costs the prefill attention kernels inside a CUDA graph: a prompt graph is captured for
a padded token count T and up to S sequences, so FlashAttention's grid is (T/128, S, heads) however few tokens the
replayed step has. Times a layer's attention replayed 50x in a graph: exact launch vs the graph's upper bounds."""
import sys
import torch
from common.engine.attention.flash_prefill import varlen_prefill
from common.engine.attention import triton_ops

dev = torch.device("cuda")
HQ, HKV, D = int(sys.argv[1]) if len(sys.argv) > 1 else 16, 8, 128


def timed(fn, reps=50):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            fn()
    g.replay(); torch.cuda.synchronize()
    best = 1e9
    for _ in range(5):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record(); g.replay(); e.record(); e.synchronize()
        best = min(best, s.elapsed_time(e) / reps * 1000)
    return best


def cu(lens, S):
    c = [0]
    for n in lens:
        c.append(c[-1] + n)
    c += [c[-1]] * (S - len(lens))
    return torch.tensor(c, dtype=torch.int32, device=dev)


kc = torch.randn(4096, 16, HKV, D, dtype=torch.bfloat16, device=dev)
vc = torch.randn_like(kc)
for T, lens in ((512, [500]), (512, [120] * 4), (2048, [2000]), (2048, [500] * 4), (2048, [60] * 32), (1024, [16] * 64)):
    n = sum(lens)
    q = torch.randn(T, HQ, D, dtype=torch.bfloat16, device=dev)
    k = torch.randn(T, HKV, D, dtype=torch.bfloat16, device=dev)
    v = torch.randn_like(k)
    row = [f"T={T} seqs={len(lens)}x{lens[0]}"]
    exact = cu(lens, len(lens))
    row.append(f"fa exact {timed(lambda: varlen_prefill(q[:n], k[:n], v[:n], exact, max(lens), 0.1)):.1f}us")
    for S in (16, 64):
        if S < len(lens):
            continue
        c = cu(lens, S)
        row.append(f"fa S={S},max=T {timed(lambda: varlen_prefill(q, k, v, c, T, 0.1)):.1f}us")
    bt = torch.arange(64 * 200, dtype=torch.int32, device=dev).view(64, 200) % 4096
    sl = torch.tensor(lens, dtype=torch.int32, device=dev) + 64
    row.append(f"paged exact {timed(lambda: triton_ops.paged_prefill_attention(q[:n], kc, vc, exact, sl, bt[:len(lens)], max(lens), 0.1)):.1f}us")
    for S in (16, 64):
        if S < len(lens):
            continue
        c = cu(lens, S)
        sls = torch.zeros(S, dtype=torch.int32, device=dev); sls[:len(lens)] = sl
        row.append(f"paged S={S},max=T {timed(lambda: triton_ops.paged_prefill_attention(q, kc, vc, c, sls, bt[:S], T, 0.1)):.1f}us")
    print(" | ".join(row), flush=True)
