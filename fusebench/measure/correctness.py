"""Is the fast mode still right? Compare forward output and every parameter gradient with
eager on identical weights and inputs, against a float64 eager reference where it fits.

A mode passes when its error vs float64 is within max(base tolerance, SLACK x the error that
plain eager in the same dtype makes): reduction order legitimately differs between modes, a
wrong gradient does not hide inside 10x eager's own rounding error."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

BASE_TOL = {"float32": 1e-4, "float64": 1e-9, "bfloat16": 3e-2, "float16": 1e-2}
AMP_TOL = 3e-2
SLACK = 10.0


def rel_err(a: torch.Tensor, ref: torch.Tensor) -> float:
    """max |a - ref| / max |ref|: one number per tensor, insensitive to where values are tiny."""
    a, ref = a.detach().double(), ref.detach().double().to(a.device)
    if a.shape != ref.shape:
        return math.inf
    if not torch.isfinite(a).all():
        return math.inf
    scale = ref.abs().max().item() if ref.numel() else 0.0
    diff = (a - ref).abs().max().item() if ref.numel() else 0.0
    return diff / scale if scale > 0 else diff


def max_err(xs, refs) -> float:
    errs = [rel_err(a, b) for a, b in zip(xs, refs)]
    return max(errs) if errs else 0.0


@dataclass(frozen=True)
class StepResult:
    """What one step produced: the output and gradients by parameter name (None for infer)."""
    out: torch.Tensor
    grads: dict[str, torch.Tensor] | None

    def grad_list(self, names):
        return [self.grads[n] for n in names]


@dataclass(frozen=True)
class Check:
    at: str
    passed: bool
    err_out: float
    err_grad: float | None
    tol: float
    detail: str


def check_step(at: str, got: StepResult, ref64: StepResult, eager: StepResult, base_tol: float,
               ref_dtype: str) -> Check:
    """ref64: eager in float64 (or in the run dtype when float64 does not fit);
    eager: eager in the run dtype, whose own error sets the slack."""
    names = sorted(ref64.grads) if ref64.grads is not None else []
    missing = [n for n in names if got.grads is None or got.grads.get(n) is None]
    e_out = rel_err(got.out, ref64.out)
    e_grad = max_err(got.grad_list(names), ref64.grad_list(names)) if names and not missing else None
    if ref_dtype == "float64":
        slack_out = rel_err(eager.out, ref64.out)
        slack_grad = max_err(eager.grad_list(names), ref64.grad_list(names)) if names else 0.0
    else:
        slack_out = slack_grad = 0.0
    tol_out = max(base_tol, SLACK * slack_out)
    tol_grad = max(base_tol, SLACK * slack_grad)
    problems = []
    if missing:
        problems.append(f"{len(missing)} parameter(s) got no gradient (first: {missing[0]})")
    if not e_out <= tol_out:
        problems.append(f"output rel err {e_out:.3g} > tol {tol_out:.3g}")
    if e_grad is not None and not e_grad <= tol_grad:
        worst = max(names, key=lambda n: rel_err(got.grads[n], ref64.grads[n]))
        problems.append(f"grad rel err {e_grad:.3g} > tol {tol_grad:.3g} (worst: {worst})")
    detail = f"{at}: " + ("; ".join(problems) if problems else f"ok vs {ref_dtype} eager")
    return Check(at, not problems, e_out, e_grad, max(tol_out, tol_grad), detail)


def finite_or_none(x: float | None) -> float | None:
    """JSON has no inf/nan: a non-finite error is recorded as None plus a failing check."""
    return x if x is not None and math.isfinite(x) else None
