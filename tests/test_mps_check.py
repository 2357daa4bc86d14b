"""A worker capped to a share of the SMs under MPS checks its model's GEMMs and refuses to serve wrong ones
(common/engine/mps_check.py: cuBLAS returned wrong bf16 products at some shares on an H200)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from common.config import ConfigError
from common.engine import mps_check


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(96, 64, bias=False),
                               torch.nn.Linear(64, 2000, bias=False))


def test_right_products_pass_and_an_uncapped_process_is_not_checked(monkeypatch):
    assert mps_check.wrong_gemms(model(), max_rows=256) == []
    monkeypatch.setattr(mps_check.F, "linear", lambda x, w: pytest.fail("checked uncapped"))
    mps_check.check_under_cap(model(), 256, share=None)


@pytest.mark.parametrize("corrupt", ["nan", "half", "one_column"])
def test_a_wrong_product_at_some_row_count_stops_a_capped_process_naming_its_share(monkeypatch, corrupt):
    """Wrong as seen on the GPU: NaN here and there, or a whole product off; and the least a projection must catch,
    one output column wrong, in the widest weight's last chunk."""
    linear = F.linear

    def wrong(x, w):
        out = linear(x, w)
        if x.shape[0] >= 100 and w.shape[0] == 2000:
            if corrupt == "nan":
                out[3, 1500] = float("nan")
            elif corrupt == "half":
                out = out * 0.5
            else:
                out[:, 1999] += 10 * out.abs().max()
        return out
    monkeypatch.setattr(mps_check.F, "linear", wrong)
    found = mps_check.wrong_gemms(model(), max_rows=256)
    assert found == [f"100 x 64 by 64 x 2000: relative error {found[0].rsplit(' ', 1)[1]}"]
    with pytest.raises(ConfigError, match=r"mps: at 70% of the SMs cuBLAS returns wrong products for 1 of"):
        mps_check.check_under_cap(model(), 256, share="70")
    assert mps_check.wrong_gemms(model(), max_rows=64) == []  # the wrong row counts not reached
