"""`fusebench kernel`: planning errors, run_cell records (ok, error, mismatch, fallback), CLI."""
import dataclasses
import json
import textwrap

import pytest
import torch

from fusebench.cli import main
from fusebench.errors import UsageError
from fusebench.cell.kernel_cell import run_cell
from fusebench.run.kernel_plan import KernelRequest, plan_kernel
from tests.helpers import interpreted_triton

SHAPE = "2,5,6,7"


def _cell(impl, tmp_path=None, **kw):
    """run_cell (the worker's side) in this process. A user file is planned as a registered
    impl, then swapped in: planning it costs a probe process (tested in test_probe.py), and
    what is under test here is the cell."""
    user = ":" in impl
    specs = plan_kernel(KernelRequest("ln2d", impls="permute" if user else impl, shapes=(SHAPE,),
                                      warmup=1, steps=3, **kw))
    assert len(specs) == 1
    spec = specs[0]
    if user:
        spec = dataclasses.replace(spec, kernel=dataclasses.replace(spec.kernel, impl=impl))
    return run_cell(spec, lambda p: None)


@pytest.fixture
def user_file(tmp_path):
    p = tmp_path / "my_ln.py"
    p.write_text(textwrap.dedent("""
        import torch
        calls = [0]
        def good(x, weight, bias, eps):
            u = x.mean(1, keepdim=True)
            v = (x - u).pow(2).mean(1, keepdim=True)
            return (x - u) * torch.rsqrt(v + eps) * weight[:, None, None] + bias[:, None, None]
        def broken(x, weight, bias, eps):
            raise RuntimeError("boom")
        def drifts(x, weight, bias, eps):      # right at first, wrong after warm-up
            calls[0] += 1
            return good(x, weight, bias, eps) * (1.0 if calls[0] < 3 else 1.01)
        def inplace_x(x, weight, bias, eps):   # right output, but x is changed (.data:
            y = good(x, weight, bias, eps)     # autograd cannot see it)
            x.data.add_(1.0)
            return y
        def inplace_weight(x, weight, bias, eps):
            y = good(x, weight, bias, eps)
            weight.data.mul_(2.0)
            return y
        def as_double(x, weight, bias, eps):   # more precise than asked: not what was asked
            return good(x.double(), weight.double(), bias.double(), eps)
    """))
    return p


def test_plan_sweep_and_extra():
    specs = plan_kernel(KernelRequest("ln2d", impls="permute,cpu", shapes=("8,96,56,56",),
                                      sweep="C=32,64"))
    assert [s.kernel.shape for s in specs] == [(8, 32, 56, 56)] * 2 + [(8, 64, 56, 56)] * 2
    assert all(s.kind == "kernel" and s.kernel.direction == "fwdbwd" for s in specs)
    assert all(s.model is None and s.kernel.family == "ln2d" for s in specs)


@pytest.mark.parametrize("kw,match", [
    (dict(impls="permut"), "did you mean permute"),
    (dict(impls="nope.py:fn"), "not found"),
    (dict(shapes=("8,96,56",)), "N,C,H,W"),
    (dict(sweep="Q=1,2"), "DIM=v1"),
    (dict(direction="up"), "--direction"),
])
def test_planning_errors(kw, match):
    with pytest.raises(UsageError, match=match):
        plan_kernel(KernelRequest("ln2d", **kw))


def test_user_impl_missing_function(user_file):
    with pytest.raises(UsageError, match="unknown function"):
        plan_kernel(KernelRequest("ln2d", impls=f"{user_file}:gdoo"))


def test_ok_record_fields():
    r = _cell("cpu").to_dict()
    assert r["status"] == "ok", r["error"]
    for k in ("family", "impl", "shape", "direction"):
        assert r["spec"]["kernel"][k] is not None
    for k in ("gbps", "pct_of_copy"):
        assert r["extra"][k] is not None
    assert r["correctness"]["checked_at"] == ["first_call", "after_timing"]
    assert r["activation_bytes"] >= 2 * 5 * 6 * 7 * 4            # x itself is saved


def test_user_impl_ok_error_and_late_mismatch(user_file):
    assert _cell(f"{user_file}:good").status == "ok"
    err = _cell(f"{user_file}:broken")
    assert err.status == "error" and "boom" in err.error.message
    late = _cell(f"{user_file}:drifts")
    assert late.status == "mismatch"
    assert late.correctness.detail.startswith("after_timing")


@pytest.mark.parametrize("direction", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("fn,says", [("inplace_x", "modified its input x in place"),
                                     ("inplace_weight", "modified its input weight in place"),
                                     ("as_double", "returned float64, expected float32")])
def test_inplace_and_wrong_dtype_are_mismatches(user_file, fn, says, direction):
    """Numbers alone would pass these (the output is right, or more precise than asked): the
    check also compares the inputs after the call and the output's dtype (#14.6)."""
    r = _cell(f"{user_file}:{fn}", direction=direction)
    assert r.status == "mismatch", (r.status, r.error)
    assert not r.correctness.passed and says in r.correctness.detail, r.correctness.detail


def test_auto_fallback_runs_function_under_its_own_name(monkeypatch):
    from fusebench.kernels.ln2d import auto
    monkeypatch.setattr(auto, "resolve", lambda device, build=True: (None, "cpu: no compiler"))
    r = _cell("auto")
    assert r.status == "ok"
    assert r.extra["ran_impl"] == "function" and r.spec.kernel.impl == "auto"
    assert any(e.category == "fallback" and "no compiler" in e.message for e in r.events)


def test_unavailable_impl_is_a_record(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)     # triton on CPU needs it
    r = _cell("triton", device="cpu")
    assert r.status == "unavailable" and "TRITON_INTERPRET" in r.error.message


def _dtype_limited():
    from fusebench.kernels.registry import families, family
    return [(fam, name) for fam in families() for name in family(fam).names()
            if family(fam)[name].dtypes is not None]


@pytest.mark.parametrize("fam, impl", _dtype_limited())
def test_a_dtype_the_impl_does_not_take_is_unavailable_not_an_error(fam, impl):
    from fusebench.kernels.registry import family
    from fusebench.spec import CellSpec
    k = family(fam)[impl]
    other = next(d for d in ("bfloat16", "float16", "float32") if d not in k.dtypes)
    spec = CellSpec.for_kernel(fam, impl, [2, 8, 4, 4], "eager", direction="fwdbwd",
                               dtype=other, device="cpu", warmup=1, steps=2)
    r = run_cell(spec, lambda p: None)
    assert r.status == "unavailable"
    assert r.error.message == f"{fam} '{impl}' takes {', '.join(k.dtypes)}, not {other}"


def test_the_cpu_kernels_that_refuse_bf16_say_so():
    assert {("bn_act", "cpu"), ("dwconv", "cpu")} <= set(_dtype_limited())


def test_cli_usage_error_exit_2(capsys):
    assert main(["kernel", "ln2d", "--impl", "permute,nosuch", "--no-save"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nosuch" in err


def test_cli_json_end_to_end(capsys, user_file):
    """Real worker processes: one ok cell and one failing user impl -> exit 1, JSON document."""
    code = main(["kernel", "ln2d", "--impl", f"permute,{user_file}:broken", "--shape", SHAPE,
                 "--steps", "2", "--warmup", "0", "--device", "cpu", "--json", "--no-save"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [r["status"] for r in doc["records"]] == ["ok", "error"]
    rec = doc["records"][0]
    assert rec["spec"]["kernel"]["family"] == "ln2d" and rec["extra"]["gbps"] > 0


def test_torchscript_compiles_the_impl_itself(tmp_path):
    """TorchScript scripts the impl function (not our harness): an annotated impl runs, a user
    fn with an unannotated float eps fails with TorchScript's own complaint about it."""
    ok = _cell("permute", modes="torchscript")
    assert ok.status == "ok", ok.error
    assert ok.correctness.passed
    p = tmp_path / "ts_ln.py"
    p.write_text(textwrap.dedent("""
        import torch
        def plain(x, weight, bias, eps):
            u = x.mean(1, keepdim=True)
            v = (x - u).pow(2).mean(1, keepdim=True)
            return (x - u) * torch.rsqrt(v + eps) * weight[:, None, None] + bias[:, None, None]
    """))
    bad = _cell(f"{p}:plain", modes="torchscript")
    assert bad.status == "error"
    assert "plain(Tensor x, Tensor weight, Tensor bias, Tensor eps)" in bad.error.message


def test_cpu_copies_alternate_with_the_steps(monkeypatch):
    """The copy a kernel's % is held to is timed in the same rounds as the kernel's steps."""
    from fusebench.cell import kernel_cell as bench
    calls = []
    monkeypatch.setattr(bench, "copy_fns", lambda x: {
        k: (lambda k=k: calls.append(k)) for k in ("plain", "huge", "prealloc")})
    x = torch.ones(4, 4)
    steps, copies = bench.time_with_copies(lambda: calls.append("step"), None, x, 3, "cpu")
    assert len(steps) == 3
    assert calls[:8] == ["step", "plain", "huge", "prealloc", "step", "plain", "huge", "prealloc"]
    assert calls.count("plain") == 5 and calls.count("step") == 3   # copies: at least 5 samples
    assert set(copies) == {"copy_gbps", "copy_plain_gbps", "copy_huge_gbps", "copy_prealloc_gbps"}
    assert copies["copy_gbps"] == max(copies["copy_plain_gbps"], copies["copy_huge_gbps"])


@pytest.mark.parametrize("impl", ["aten", "cpu", "function", "triton"])
def test_every_gn_act_impl_runs_as_a_cell_and_the_fused_ones_save_half(impl):
    """gn_act's impls take four arguments after x (weight, bias, groups, eps): the cell calls
    them; the kernel and the Function save x and the statistics, aten also its output."""
    from fusebench.spec import CellSpec
    if impl == "triton":
        interpreted_triton()
    r, aten = (run_cell(CellSpec.for_kernel("gn_act", i, [2, 64, 6, 5], "eager",
                                            direction="fwdbwd", dtype="float32", device="cpu",
                                            warmup=1, steps=2), lambda p: None)
               for i in (impl, "aten"))
    assert r.status == "ok" and aten.status == "ok", r.error
    assert r.correctness.passed
    if impl != "aten":
        assert r.activation_bytes < 0.6 * aten.activation_bytes
