"""layers/fusion.py hands a layer a Triton module only where the module's own `fits` says it serves the call."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from common.engine.layers import fusion


@pytest.mark.parametrize("pick, name", [(fusion.skinny_gemm, "gemv"), (fusion.split_k_gemm, "splitk"),
                                        (fusion.head_sampler, "head_sampler")])
def test_a_module_serves_only_cuda_inputs_it_fits(pick, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    module = SimpleNamespace(fits=lambda x, w: asked.append((x, w)) or x.fits)
    monkeypatch.setitem(fusion._loaded, name, module)
    weight = torch.empty(4, 4)
    assert pick(torch.empty(2, 4), weight) is None and not asked  # a CPU tensor: not even asked
    on_cuda = SimpleNamespace(is_cuda=True, fits=True)
    assert pick(on_cuda, weight) is module and asked == [(on_cuda, weight)]
    assert pick(SimpleNamespace(is_cuda=True, fits=False), weight) is None
    monkeypatch.setitem(fusion._loaded, name, None)  # triton not importable: the torch path
    assert pick(on_cuda, weight) is None
