"""Is the fast mode still right? Compare forward output and every parameter gradient with
eager on identical weights and inputs, against a float64 eager reference where it fits.

A mode passes when its error vs float64 is within max(base tolerance, SLACK x the error that
plain eager in the same dtype makes) — the shape of dynamo's accuracy checker (`same` with an
fp64 reference), with a wider multiplier because our error is a max, not an RMS: reduction
order legitimately differs between modes, a wrong gradient does not hide inside 10x eager's
own rounding error. Where eager itself is far from float64
(pure bf16 through many BatchNorms), the check is flagged as weak rather than passed quietly.
Where no float64 copy fits, the reference is eager in the run dtype and the same rule holds:
eager's own error is measured against float64 on a sub-batch (`eager_err`, see
cell/model_check.py); each Check says which reference and tolerances it used."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

SLACK = 10.0   # inductor's steady-state grads on efficientnet_b0 sit at ~3x eager's error
WEAK = 0.1   # eager's own error vs float64 above this: the check cannot see small mode errors


@dataclass(frozen=True)
class Tolerance:
    base: float    # absolute floor of the pass threshold (relative error units)
    floor: float   # a gradient's scale is at least this fraction of the largest gradient's


TOLERANCES = {"float32": Tolerance(1e-4, 1e-3), "float64": Tolerance(1e-9, 1e-3),
              "bfloat16": Tolerance(3e-2, 1e-2), "float16": Tolerance(1e-2, 1e-2)}
AMP = Tolerance(3e-2, 1e-2)


def tolerance_for(dtype: str, amp: bool) -> Tolerance:
    return AMP if amp else TOLERANCES[dtype]


def rel_err(a: torch.Tensor, ref: torch.Tensor, floor: float = 0.0) -> float:
    """max |a - ref| / max(max |ref|, floor): one number per tensor. The floor keeps a gradient
    that is ~0 in exact arithmetic (a conv bias before BatchNorm) from dividing rounding noise
    by rounding noise."""
    a, ref = a.detach().double(), ref.detach().double().to(a.device)
    if a.shape != ref.shape:
        return math.inf
    if not torch.isfinite(a).all():
        return math.inf
    scale = max(ref.abs().max().item() if ref.numel() else 0.0, floor)
    diff = (a - ref).abs().max().item() if ref.numel() else 0.0
    return diff / scale if scale > 0 else diff


def grad_errs(got: dict, ref: dict, names, floor: float) -> dict[str, float]:
    """Per-tensor error, each scaled by max(own magnitude, floor x the largest gradient)."""
    top = max((ref[n].detach().abs().max().item() for n in names if ref[n].numel()),
              default=0.0)
    return {n: rel_err(got[n], ref[n], floor * top) for n in names}


@dataclass(frozen=True)
class StepResult:
    """What one step produced: the output and gradients by parameter name (None for infer);
    `inputs`: the float inputs' gradients by position ("input 0"), where the step asked for
    them (None: not asked)."""
    out: torch.Tensor
    grads: dict[str, torch.Tensor] | None
    inputs: dict[str, torch.Tensor | None] | None = None


@dataclass(frozen=True)
class Check:
    at: str
    passed: bool
    err_out: float
    err_grad: float | None
    tol: float
    detail: str
    weak: bool = False   # eager itself was far from float64: small mode errors are invisible
    reference: str = "float64"     # dtype of the eager reference compared with
    tol_out: float | None = None
    tol_grad: float | None = None
    input_grads: int | None = None   # input gradients compared (None: not asked for)


def graded(ref: StepResult) -> list[str]:
    """The parameters the reference gives a gradient. A trainable parameter with none in eager
    (a frozen teacher or EMA branch run under no_grad, an unused head) is not compared: no
    gradient is its right answer."""
    return sorted(n for n, g in (ref.grads or {}).items() if g is not None)


def unexpected_grads(got: StepResult, ref: StepResult) -> list[str]:
    """Parameters (and asked-for inputs) the mode gave a nonzero gradient where the reference
    gives none: a branch that should have been cut from autograd. A zero tensor in place of
    None is the same answer: some compilers materialise it."""
    pairs = [(got.grads, ref.grads), (got.inputs, ref.inputs)]
    return sorted(n for mine, theirs in pairs if mine is not None and theirs is not None
                  for n, g in mine.items()
                  if g is not None and theirs.get(n) is None and bool(g.detach().any()))


def all_grad_errs(got: StepResult, ref: StepResult, floor: float) -> dict[str, float]:
    """grad_errs of the parameters and, where `got` has them, of the inputs: each group scaled
    by its own largest gradient (an image's gradient can be orders below the weights')."""
    errs = grad_errs(got.grads, ref.grads, graded(ref), floor)
    if got.inputs is not None and ref.inputs is not None:
        names = sorted(n for n, g in ref.inputs.items() if g is not None)
        errs |= grad_errs(got.inputs, ref.inputs, names, floor)
    return errs


def eager_error(eager: StepResult, ref64: StepResult, tol: Tolerance) -> tuple[float, float]:
    """(output, worst gradient) error of eager in the run dtype against float64 eager."""
    return (rel_err(eager.out, ref64.out),
            max(all_grad_errs(eager, ref64, tol.floor).values(), default=0.0))


def check_step(at: str, got: StepResult, ref64: StepResult, eager: StepResult, tol: Tolerance,
               ref_dtype: str, eager_err: tuple[float, float] | None = None,
               ref_note: str = "") -> Check:
    """ref64: eager in float64 (or in the run dtype when float64 does not fit);
    eager: eager in the run dtype, whose own error sets the slack. `eager_err` overrides that
    error (a float32 reference: eager's error measured against float64 on a sub-batch)."""
    missing = [n for n in graded(ref64) if got.grads is None or got.grads.get(n) is None]
    if got.inputs is not None:
        missing += [n for n, g in (ref64.inputs or {}).items()
                    if g is not None and got.inputs.get(n) is None]
    extra = unexpected_grads(got, ref64)
    e_out = rel_err(got.out, ref64.out)
    errs = all_grad_errs(got, ref64, tol.floor) if ref64.grads is not None and not missing else {}
    e_grad = max(errs.values()) if errs else None
    if eager_err is not None:
        slack_out, slack_grad = eager_err
    elif ref_dtype == "float64":
        slack_out, slack_grad = eager_error(eager, ref64, tol)
    else:
        slack_out = slack_grad = 0.0
    tol_out = max(tol.base, SLACK * slack_out)
    tol_grad = max(tol.base, SLACK * slack_grad)
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensor(s) got no gradient (first: {missing[0]})")
    if extra:
        problems.append(f"{len(extra)} tensor(s) got a nonzero gradient eager does not give "
                        f"(first: {extra[0]})")
    if not e_out <= tol_out:
        problems.append(f"output rel err {e_out:.3g} > tol {tol_out:.3g}")
    if e_grad is not None and not e_grad <= tol_grad:
        worst = max(errs, key=errs.get)
        problems.append(f"grad rel err {e_grad:.3g} > tol {tol_grad:.3g} (worst: {worst})")
    n_in = None if got.inputs is None else sum(g is not None for g in (ref64.inputs or {}).values())
    detail = f"{at}: " + ("; ".join(problems) if problems else f"ok vs {ref_dtype} eager")
    if n_in:
        detail += f" (input gradients too: {n_in})"
    detail += f" {ref_note}" if ref_note else ""
    weak = max(slack_out, slack_grad) > WEAK
    if weak:
        detail += (f" (weak check: eager in this dtype is itself {max(slack_out, slack_grad):.2g}"
                   f" from float64)")
    return Check(at, not problems, e_out, e_grad, max(tol_out, tol_grad), detail, weak,
                 ref_dtype, tol_out, tol_grad, n_in)


def rechecked(first: Check, second: Check, where: str = "on a perturbed batch") -> Check:
    """A failed check and the same check repeated once on a slightly perturbed batch at the
    same weights, or for token inputs at slightly perturbed weights (cell/model_cell.py): the
    second decides. Why: where float32 rounding puts one
    value on the other side of an activation's kink (hardswish's -3 / 3, ReLU6's 6, a
    hardsigmoid gate's -3 / 3) in the mode and not in eager, its derivative jumps there and one
    gradient is off by a percent or more on that batch only; a wrong kernel fails both. The
    detail keeps the first failure."""
    again = second.detail.split(": ", 1)[-1]
    verdict = ("the first failure did not repeat" if second.passed else "failed again")
    return replace(second, detail=f"{first.detail}; {where}: {again} ({verdict})")


def finite_or_none(x: float | None) -> float | None:
    """JSON has no inf/nan: a non-finite error is recorded as None plus a failing check."""
    return x if x is not None and math.isfinite(x) else None
