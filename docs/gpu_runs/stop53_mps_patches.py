"""Stop 53: patches for `gen` (stop48_mps_client.sh's PATCH) that test why the fused LM head and sampler's CUDA graph
returns tokens beyond the vocabulary in a process capped to an MPS share of the SMs (docs/benchmarks.md, stop 48).
The answer, found after (stop53_mps_gemms.sh): cuBLAS's products are wrong at that share."""
from __future__ import annotations

import torch


def gate_off() -> None:
    """The fused head serves under the cap too (fusion.py keeps it out of an MPS-capped process)."""
    from common.engine.layers import fusion
    fusion.mps_share = lambda: None


def own_pool() -> None:
    """The sampler graphs captured each into a memory pool of its own, not the decode graphs' pool."""
    from common.engine import sampler_graph
    capture = sampler_graph.SamplerGraphs.capture
    sampler_graph.SamplerGraphs.capture = lambda self, pool: capture(self, None)


def no_sampler_graphs() -> None:
    """The head and sampler run eagerly after the decode graph's replay."""
    from common.engine import model_runner
    model_runner.ModelRunner._capture_sampler_graphs = lambda self: None


def filled() -> None:
    """The head kernel's per-tile results start filled (best -inf, index -7): an entry no program wrote shows as -7,
    a token the graph's other memory overwrote as something else."""
    from common.engine.layers import head_sampler
    empty = torch.empty

    def full(*shape, dtype=None, device=None):
        return (torch.full(shape, float("-inf"), dtype=dtype, device=device) if dtype == torch.float32
                else torch.full(shape, -7, dtype=dtype, device=device))
    head_sampler.torch = type("T", (), {"empty": staticmethod(full), "float32": torch.float32, "int64": torch.int64,
                                        "Tensor": torch.Tensor})
    del empty


def log_tokens() -> None:
    """Each graphed step's tokens, printed as the sampler graph returns them (beyond the vocabulary marked)."""
    from common.engine import sampler_graph
    replay = sampler_graph.SamplerGraphs.replay

    def logged(self, bucket, batch):
        tokens = replay(self, bucket, batch)
        torch.cuda.synchronize()
        print("TOKENS", bucket, tokens.tolist(), flush=True)
        return tokens
    sampler_graph.SamplerGraphs.replay = logged
