"""layers/fusion.py hands a layer a Triton module only where the module's own `fits` says it serves the call."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from common.engine.device import mps_share
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


@pytest.mark.parametrize("share", [None, "100", "70"])
def test_the_fused_head_serves_a_process_under_an_mps_cap_too(share, monkeypatch: pytest.MonkeyPatch):
    """It was kept out of capped processes after its graphs sampled tokens beyond the vocabulary under a 70% cap: the
    cause was cuBLAS's wrong products at that share, which a capped worker now refuses (common/engine/mps_check.py;
    tests/test_mps_gpu.py runs it capped)."""
    module = SimpleNamespace(fits=lambda x, w: True)
    monkeypatch.setitem(fusion._loaded, "head_sampler", module)
    if share is None:
        monkeypatch.delenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", raising=False)
    else:
        monkeypatch.setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", share)
    mps_share.cache_clear()  # read once a process; this test changes it
    try:
        picked = fusion.head_sampler(SimpleNamespace(is_cuda=True), torch.empty(4, 4))
    finally:
        mps_share.cache_clear()
    assert picked is module
