"""Stop 53: forward hooks that print the first module whose output holds a NaN (its name, class and the input's
shape), for `generate` as an MPS client at a share that returned NaN rows (stop53_mps_eager.sh)."""
from __future__ import annotations

import torch

_seen: list[str] = []


def install() -> None:
    from common.engine import model_runner
    load = model_runner.ModelRunner._load_model if hasattr(model_runner.ModelRunner, "_load_model") else None
    init = model_runner.ModelRunner.__init__

    def hooked(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for name, module in self.model.named_modules():
            module.register_forward_hook(_hook(name))
    model_runner.ModelRunner.__init__ = hooked
    del load


def _hook(name: str):
    def check(module, inputs, output):
        if len(_seen) >= 3:
            return
        out = output[0] if isinstance(output, tuple) else output
        if isinstance(out, torch.Tensor) and out.is_floating_point() and torch.isnan(out).any().item():
            first = next((i for i in inputs if isinstance(i, torch.Tensor)), None)
            ins = [(tuple(i.shape), bool(torch.isnan(i).any().item()) if i.is_floating_point() else None)
                   for i in inputs if isinstance(i, torch.Tensor)]
            _seen.append(name)
            print(f"NAN in {name} ({type(module).__name__}): out {tuple(out.shape)}, inputs {ins}", flush=True)
            del first
    return check
