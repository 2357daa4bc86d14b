"""Probe (stop 19): two-batch overlap for the batch-64 decode step. 28 Qwen3-0.6B layers (distinct weights and
KV caches, context 1024, 16-token pages) in one CUDA graph, the engine's own kernels (fused RMSNorm, q/k-norm +
RoPE + KV store, paged decode attention, SiLU-and-mul) with cuBLAS projections. Prints us a step for:

  serial64    one batch of 64, as the engine runs it today
  serial2x32  two halves of 32 one after the other on one stream (the cost of reading the weights twice)
  tbo-free    the halves on two streams, no ordering between them
  tbo-alt     the halves on two streams, each half's attention ordered after the other half's, so one half's
              projections run beside the other's attention
  ...-nosplit the same with the half-batch attention unsplit (one program per sequence and KV head)
  ...-prio    the projection-heavy half on a high-priority stream

    PYTHONPATH=... python docs/gpu_runs/stop19_tbo_probe.py
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from common.engine.attention.decode_plan import plan_decode
from common.engine.attention.triton_ops import paged_decode_attention
from common.engine.layers import fused

H, NQ, NKV, D, I, LAYERS, CTX, PAGE = 1024, 16, 8, 128, 3072, 28, 1024, 16
Q, KV = NQ * D, NKV * D
dev = torch.device("cuda")
torch.manual_seed(0)


def rand(*shape, scale=0.02):
    return torch.randn(*shape, device=dev, dtype=torch.bfloat16) * scale


layers = [dict(qkv=rand(Q + 2 * KV, H), o=rand(H, Q), gate_up=rand(2 * I, H), down=rand(H, I),
               n1=torch.ones(H, device=dev, dtype=torch.bfloat16), n2=torch.ones(H, device=dev, dtype=torch.bfloat16),
               qn=torch.ones(D, device=dev, dtype=torch.bfloat16), kn=torch.ones(D, device=dev, dtype=torch.bfloat16),
               kc=rand(64 * CTX // PAGE + 8, PAGE, NKV, D, scale=1.0), vc=rand(64 * CTX // PAGE + 8, PAGE, NKV, D, scale=1.0))
          for _ in range(LAYERS)]
cos_sin = torch.randn(CTX + 16, D, device=dev, dtype=torch.float32)


class Half:
    """One sub-batch's inputs: rows [lo, hi) of the batch of 64, each at position CTX - 1."""

    def __init__(self, lo: int, hi: int, split: bool):
        n = hi - lo
        pages = CTX // PAGE
        self.positions = torch.full((n,), CTX - 1, device=dev, dtype=torch.long)
        self.tables = torch.arange(lo * pages, hi * pages, device=dev, dtype=torch.int32).view(n, pages)
        self.seq_lens = torch.full((n,), CTX, device=dev, dtype=torch.int32)
        self.slots = (self.tables[:, -1].long() * PAGE + PAGE - 1)
        self.plan = plan_decode([CTX] * n, NKV, dev, **({} if split else {"max_num_splits": 1}))
        self.x = rand(n, H, scale=1.0)
        self.res = rand(n, H, scale=1.0)


def attention_stage(w, h: Half, x, res):
    hn, res = fused.rms_norm(x, w["n1"], 1e-6, res)
    qkv = F.linear(hn, w["qkv"])
    q, k, v = qkv.split([Q, KV, KV], dim=-1)
    q, k, v = q.view(-1, NQ, D), k.view(-1, NKV, D), v.view(-1, NKV, D)
    fused.qk_norm_rope_(q, k, h.positions, cos_sin, w["qn"], w["kn"], 1e-6, v, w["kc"], w["vc"], h.slots)
    a = paged_decode_attention(q, w["kc"], w["vc"], h.tables, h.seq_lens, D ** -0.5, plan=h.plan)
    return a.flatten(1), res


def mlp_stage(w, a, res):
    z = F.linear(a, w["o"])
    hn, res = fused.rms_norm(z, w["n2"], 1e-6, res)
    return F.linear(fused.silu_and_mul(F.linear(hn, w["gate_up"])), w["down"]), res


def serial(halves):
    for h in halves:
        x, res = h.x, h.res
        for w in layers:
            a, res = attention_stage(w, h, x, res)
            x, res = mlp_stage(w, a, res)


def tbo(halves, alternate: bool, streams):
    """Half A on streams[0], half B on streams[1]; with `alternate`, B's attention of layer L waits for A's,
    and A's attention of layer L+1 waits for B's, so the attention phases take turns."""
    main = torch.cuda.current_stream()
    for s in streams:
        s.wait_stream(main)
    state = [(h.x, h.res) for h in halves]
    done = [None, None]
    for w in layers:
        for i, (h, s) in enumerate(zip(halves, streams)):
            with torch.cuda.stream(s):
                if alternate and done[1 - i] is not None:
                    s.wait_event(done[1 - i])
                x, res = state[i]
                a, res = attention_stage(w, h, x, res)
                ev = torch.cuda.Event()
                ev.record(s)
                done[i] = ev
                state[i] = mlp_stage(w, a, res)
    for s in streams:
        main.wait_stream(s)


def time_graph(fn, reps=30):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / reps * 1e3


print(torch.cuda.get_device_name(), flush=True)
full = Half(0, 64, split=True)
print(f"batch 64 plan split: {full.plan.split}", flush=True)
lo, hi = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=0)
prio = torch.cuda.Stream(priority=-1)  # lower number = higher priority
for split in (True, False):
    halves = [Half(0, 32, split), Half(32, 64, split)]
    tag = "" if split else "-nosplit"
    print(f"halves plan split: {halves[0].plan.split}", flush=True)
    rows = {"serial64": time_graph(lambda: serial([full]))} if split else {}
    rows["serial2x32" + tag] = time_graph(lambda: serial(halves))
    rows["tbo-free" + tag] = time_graph(lambda: tbo(halves, False, [lo, hi]))
    rows["tbo-alt" + tag] = time_graph(lambda: tbo(halves, True, [lo, hi]))
    rows["tbo-alt-prio" + tag] = time_graph(lambda: tbo(halves, True, [prio, lo]))
    for _ in range(2):  # repeat to see the noise
        rows["serial64 again" if split else "tbo-alt-nosplit again"] = time_graph(
            (lambda: serial([full])) if split else (lambda: tbo(halves, True, [lo, hi])))
    print("  ".join(f"{k} {v:.0f} us" for k, v in rows.items()), flush=True)
