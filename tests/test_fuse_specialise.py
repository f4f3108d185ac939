"""Optional arguments of a traced forward (fuse/fx/specialise.py): fx traces a default of None
as a Proxy, which `is not None`, so nanoGPT's `forward(idx, targets=None)` used to trace its
loss branch and crash when called without targets; a flag default (`if return_features:`)
stopped the trace. Now the branch taken by the defaults is traced, the call is checked, and
another value runs the module's own forward with a warning."""
from __future__ import annotations

import copy
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusebench.fuse import fuse

sys.path.insert(0, str(Path(__file__).parent))
from assets import nano_gpt  # noqa: E402


class WithTargets(nano_gpt.GPT):
    """nanoGPT's own signature: logits and, given targets, the loss."""

    def forward(self, idx, targets=None):
        logits = super().forward(idx)
        if targets is not None:
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, None


class Features(nn.Module):
    """A flag default a forward branches on, and a mask passed through untouched."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 32), nn.Linear(32, 8)

    def forward(self, x, mask=None, return_features=False):
        h = F.gelu(self.fc1(x))
        y = self.fc2(h)
        y = F.scaled_dot_product_attention(y[:, None], y[:, None], y[:, None],
                                           attn_mask=mask)[:, 0]
        return (y, h) if return_features else y


def _ids():
    return torch.randint(0, nano_gpt.VOCAB, (2, nano_gpt.CONTEXT),
                         generator=torch.Generator().manual_seed(1))


def test_a_none_default_the_forward_branches_on_is_fixed_and_checked(site_calls):
    torch.manual_seed(0)
    model = WithTargets().double()
    ref = copy.deepcopy(model)
    assert dict(fuse(model, "train").sites) == {"attention": 2, "mlp": 2}
    idx = _ids()
    logits, loss = model(idx)                       # traced for: no targets, no loss
    assert loss is None
    torch.testing.assert_close(logits, ref(idx)[0])
    assert site_calls == {"fused_attention": 2, "fused_mlp": 2}
    site_calls.clear()
    with pytest.warns(UserWarning, match="traced with targets=None; called with another value"):
        got = model(idx, targets=idx)               # its own forward: the loss, as eager
    torch.testing.assert_close(got[1], ref(idx, idx)[1])
    assert site_calls == {}


def test_a_flag_default_now_traces_and_a_passed_mask_stays_an_argument(site_calls):
    """`return_features` stopped the trace (a Proxy has no truth value): now fixed to False.
    `mask` flows into SDPA without a branch: it stays a graph input, so a mask passed at
    call time runs the fused graph too."""
    torch.manual_seed(0)
    model = Features().double()
    ref = copy.deepcopy(model)
    res = fuse(model, "train")
    assert dict(res.sites) == {"mlp": 1}
    assert not [m for k, m in res.notes if k == "fx_fallback"], res.notes
    x = torch.randn(4, 3, 8, dtype=torch.float64)
    mask = torch.ones(3, 3, dtype=torch.bool).tril()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(model(x), ref(x))
        torch.testing.assert_close(model(x, mask), ref(x, mask))
        torch.testing.assert_close(model(x, mask=mask), ref(x, mask=mask))
    assert site_calls == {"fused_mlp": 3}
    with pytest.warns(UserWarning, match="return_features=False"):
        y, h = model(x, return_features=True)
    torch.testing.assert_close(h, ref(x, return_features=True)[1])
    assert site_calls == {"fused_mlp": 3}
