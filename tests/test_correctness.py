"""The pass/fail rule of the correctness check, on synthetic steps."""
from __future__ import annotations

import torch

from fusebench.measure.correctness import StepResult, check_step, rel_err, tolerance_for

F32 = tolerance_for("float32", amp=False)


def _step(scale_w=1.0, bias=1e-9, noise=0.0, out_scale=1.0):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(8, 8, generator=g, dtype=torch.float64)
    out = torch.randn(4, 10, generator=g, dtype=torch.float64)
    grads = {"w": w * scale_w + noise * torch.randn(8, 8, generator=g, dtype=torch.float64),
             "bias_before_bn": torch.full((8,), bias, dtype=torch.float64)}
    return StepResult(out * out_scale, grads)


def test_identical_passes_and_scaled_gradient_fails():
    ref = _step()
    assert check_step("first", _step(), ref, _step(), F32, "float64").passed
    bad = check_step("steady", _step(scale_w=1.5), ref, _step(), F32, "float64")
    assert not bad.passed and "worst: w" in bad.detail and bad.err_grad > 0.4


def test_near_zero_gradient_noise_is_not_a_mismatch():
    # a conv bias in front of BatchNorm: 0 in exact arithmetic, rounding noise in float32
    ref, got = _step(bias=1e-17), _step(bias=3e-9)
    assert rel_err(got.grads["bias_before_bn"], ref.grads["bias_before_bn"]) > 1e6
    assert check_step("first", got, ref, got, F32, "float64").passed


def test_missing_gradient_fails():
    ref, got = _step(), _step()
    del got.grads["w"]
    c = check_step("first", got, ref, ref, F32, "float64")
    assert not c.passed and "got no gradient" in c.detail


def test_weak_check_is_flagged_when_eager_itself_is_far_from_float64():
    ref = _step()
    eager = _step(out_scale=1.3)          # eager in low precision: 30% off
    c = check_step("first", _step(out_scale=1.3), ref, eager, tolerance_for("bfloat16", False),
                   "float64")
    assert c.passed and c.weak and "weak check" in c.detail


def test_sign_flip_fails_when_eager_is_close():
    ref, eager = _step(), _step(out_scale=1.02)     # eager 2% off: tol 0.2
    bf16 = tolerance_for("bfloat16", False)
    assert check_step("first", _step(out_scale=1.05), ref, eager, bf16, "float64").passed
    flipped = check_step("first", _step(out_scale=-1.0), ref, eager, bf16, "float64")
    assert not flipped.passed and not flipped.weak


def test_a_gradient_eager_does_not_give_is_not_compared_and_must_stay_absent():
    ref, got = _step(), _step()
    ref.grads["frozen"] = got.grads["frozen"] = None      # a teacher branch under no_grad
    assert check_step("first", got, ref, ref, F32, "float64").passed
    got.grads["frozen"] = torch.zeros(3, dtype=torch.float64)   # a materialised zero: same
    assert check_step("first", got, ref, ref, F32, "float64").passed
    got.grads["frozen"] = torch.ones(3, dtype=torch.float64)
    c = check_step("first", got, ref, ref, F32, "float64")
    assert not c.passed and "eager does not give (first: frozen)" in c.detail


def test_input_gradients_are_compared_on_their_own_scale():
    ref = _step()
    small = torch.full((4, 8), 1e-6, dtype=torch.float64)    # far below the weights' grads
    ref = StepResult(ref.out, ref.grads, {"input 0": small, "input 1": None})
    same = StepResult(ref.out, ref.grads, {"input 0": small.clone(), "input 1": None})
    c = check_step("steady", same, ref, ref, F32, "float64")
    assert c.passed and c.input_grads == 1 and "input gradients too: 1" in c.detail
    wrong = StepResult(ref.out, ref.grads, {"input 0": 2 * small, "input 1": None})
    c = check_step("steady", wrong, ref, ref, F32, "float64")
    assert not c.passed and "worst: input 0" in c.detail
    lost = StepResult(ref.out, ref.grads, {"input 0": None, "input 1": None})
    assert "got no gradient (first: input 0)" in check_step("s", lost, ref, ref, F32,
                                                              "float64").detail
    unasked = StepResult(ref.out, ref.grads)
    assert check_step("first", unasked, ref, ref, F32, "float64").input_grads is None
