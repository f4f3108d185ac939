"""Any model, not only float images (issue 11 part 5): example_inputs, the loss rule for other
outputs, tied weights under aot, and what a failing call says."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
import torch

from fusebench.cell.model_cell import run_cell
from fusebench.cell.model_step import Loss
from fusebench.errors import UsageError
from fusebench.models.source import resolve_model
from fusebench.spec import CellSpec
from tests.helpers import ASSETS

GPT = f"{ASSETS / 'tiny_gpt.py'}:make"
MASKED = f"{ASSETS / 'tiny_gpt.py'}:masked_sum"
WRONG = f"{ASSETS / 'tiny_gpt.py'}:wrong_inputs"


def _spec(model=GPT, mode="eager", **kw):
    base = dict(batch_size=4, warmup=1, steps=2, threads=1)
    return CellSpec.for_model(model, mode, **{**base, **kw})


def _run(spec):
    return run_cell(spec, lambda phase: None)


@pytest.mark.parametrize("mode", ["eager", "torchscript", "aot", "compile", "fused"])
def test_tiny_gpt_trains_in_every_mode(mode):
    # one block for compile: its cold compile is the slow part, the ops are the same
    spec = _spec(mode=mode, model_kwargs={"layers": 1} if mode == "compile" else {})
    rec = _run(spec)
    assert rec.status == "ok", (rec.error, rec.correctness)
    assert rec.extra["inputs"] == "int64[4, 16]"
    assert rec.extra["input_shape"] == [[4, 16]]
    assert rec.spec.model.img_size is None          # no image size was run
    assert rec.gflops and rec.gflops > 0
    assert rec.activation_bytes and rec.activation_bytes > 0
    if mode != "eager":
        assert rec.correctness.passed and rec.correctness.checked_at == ("first", "steady")
        assert rec.extra["correctness_reference"][0]["reference"] == "float64"


def test_tiny_gpt_infers_under_aot_and_fused():
    # (torchscript infer after torchscript train of the same class in one process trips over
    # the JIT's per-class state; cells run one per process, so only aot/fused are here)
    for mode in ("aot", "fused"):
        rec = _run(_spec(mode=mode, bench="infer"))
        assert rec.status == "ok" and rec.correctness.passed, rec.correctness


def test_quick_runs_a_token_model_without_its_image_size():
    """--quick's 96 px is a preset for image models: a model with example_inputs runs
    without it (it failed every cell before), and its record says no size was run; an
    image model still runs at it."""
    from fusebench.run.plan import RunRequest, plan_run
    specs = plan_run(RunRequest(models=f"{GPT},efficientnet_b0", modes="eager", quick=True,
                                threads=1))
    assert {s.model.size_preset for s in specs} == {True}
    gpt, effnet = (_run(s) for s in specs)
    assert gpt.status == "ok" and gpt.spec.model.img_size is None, gpt.error
    assert effnet.status == "ok" and effnet.spec.model.img_size == 96, effnet.error
    with pytest.raises(UsageError, match="--img-size does not apply"):   # asked for: refused
        plan_run(RunRequest(models=GPT, modes="eager", quick=True, img_sizes="64"))


def test_quick_keeps_the_size_of_a_model_that_takes_one_size_only():
    """A model declaring `fixed_input_size` (timm's name; its ViTs and Swins set it) runs at
    its own size under --quick, where the 96 px preset would fail eager itself; an explicit
    --img-size is still given to it."""
    from fusebench.run.plan import RunRequest, plan_run
    fixed = f"{ASSETS / 'probe_models.py'}:fixed_size"
    (spec,) = plan_run(RunRequest(models=fixed, modes="eager", quick=True, threads=1))
    assert spec.model.size_preset and spec.model.img_size == 96
    rec = _run(spec)
    assert rec.status == "ok" and rec.spec.model.img_size == 32, rec.error
    (asked,) = plan_run(RunRequest(models=fixed, modes="eager", quick=True, img_sizes="64",
                                   threads=1))
    with pytest.raises(ValueError, match="not the model's 32x32"):   # the worker's record
        _run(asked)


def test_a_failed_cell_of_a_token_model_under_quick_says_no_size_ran(tmp_path):
    """A token model that fails after making its inputs: the worker's error record carries
    the size the cell noted (none), not --quick's preset 96 px."""
    from fusebench.cell.worker import run
    from fusebench.spec import CellSpec
    f = tmp_path / "broken.py"
    f.write_text("import torch\n"
                 "class M(torch.nn.Module):\n"
                 "    def __init__(self):\n"
                 "        super().__init__()\n        self.e = torch.nn.Embedding(8, 4)\n"
                 "    def forward(self, idx):\n        raise ValueError('broken on purpose')\n"
                 "def make():\n    return M()\n"
                 "def example_inputs(b, device, dtype):\n"
                 "    return (torch.zeros(b, 3, dtype=torch.long),)\n")
    spec = CellSpec.for_model(f"{f}:make", "eager", batch_size=2, img_size=96,
                              size_preset=True, warmup=1, steps=1)
    rec = run(spec.to_dict())
    assert rec["status"] == "error" and "broken on purpose" in rec["error"]["message"]
    assert rec["spec"]["model"]["img_size"] is None


def test_an_img_size_for_a_model_with_its_own_inputs_is_refused_at_planning(capsys):
    """tiny_gpt's example_inputs() sits in its module: one line, exit 2, no cell run."""
    from fusebench.cli import main
    assert main(["run", GPT, "-m", "eager", "--img-size", "64", "--no-save"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--img-size does not apply" in err, err


def test_aot_keeps_tied_weights_tied_and_trains_them():
    from fusebench.measure.events import EventLog
    from fusebench.modes import get_mode
    model = resolve_model(GPT).build()
    assert model.lm_head.weight is model.wte.weight
    (idx,) = model.example_inputs(2, "cpu", torch.float32)
    ref = resolve_model(GPT).build()
    ref.load_state_dict(model.state_dict())
    fn = get_mode("aot").prepare(model, (idx,), {}, EventLog())
    fn(idx).float().pow(2).mean().backward()
    ref(idx).float().pow(2).mean().backward()
    assert model.lm_head.weight is model.wte.weight
    # the tied weight's gradient sums both uses (embedding and lm_head), as in eager
    torch.testing.assert_close(model.wte.weight.grad, ref.wte.weight.grad)


def test_several_inputs_from_the_module_hook_integers_kept_for_reference():
    src = resolve_model(MASKED)
    model = src.build()
    inputs = src.example_inputs(model, "train", 3)
    assert [a.dtype for a in inputs.args] == [torch.float32, torch.int64]
    ref = inputs.reference()
    assert [a.dtype for a in ref] == [torch.float64, torch.int64]
    assert torch.equal(ref[1], inputs.args[1])
    rec = _run(_spec(MASKED, "aot"))
    assert rec.status == "ok" and rec.correctness.passed
    assert rec.extra["inputs"] == "float32[4, 5, 8], int64[4, 5]"


def test_image_models_keep_the_input_size_shortcut():
    rec = _run(_spec(f"{ASSETS / 'tiny_models.py'}:tiny_cnn", "aot"))
    assert rec.status == "ok"
    assert rec.extra["input_shape"] == [3, 16, 16] and rec.spec.model.img_size == 16
    assert "inputs" not in rec.extra


def test_failing_call_says_what_the_model_was_given():
    with pytest.raises(RuntimeError, match=r"\[model called with: float32\[4, 3\]\]"):
        _run(_spec(WRONG))
    from fusebench.cell.worker import run
    rec = run(_spec(WRONG, "aot").to_dict())
    assert rec["status"] == "error"
    assert "[model called with: float32[4, 3]]" in rec["error"]["message"]


def test_bad_example_inputs_and_img_size_are_usage_errors(tmp_path):
    f = tmp_path / "bad.py"
    f.write_text("import torch\n"
                 "def make():\n    return torch.nn.Linear(2, 2)\n"
                 "def example_inputs(b, device, dtype):\n    return {'x': 1}\n")
    src = resolve_model(f"{f}:make")
    with pytest.raises(UsageError, match="example_inputs must return a tensor or a tuple"):
        src.example_inputs(src.build(), "train", 2)
    with pytest.raises(UsageError, match="--img-size does not apply"):
        resolve_model(GPT).example_inputs(resolve_model(GPT).build(), "train", 2, img_size=32)


def test_loss_rule():
    torch.manual_seed(0)
    loss = Loss(4, torch.tensor([3, 7, 11, 999]), seed=5)
    logits = torch.randn(4, 10, requires_grad=True)      # (B, K): cross-entropy
    expect = torch.nn.functional.cross_entropy(logits, torch.tensor([3, 7, 1, 9]))
    torch.testing.assert_close(loss(logits), expect)
    seq = torch.randn(4, 6, 20)                            # (B, T, V): token cross-entropy
    a, b = loss(seq), Loss(4, loss.target, seed=5)(seq)
    torch.testing.assert_close(a, b)                       # targets fixed by the seed
    assert abs(a.item() - torch.log(torch.tensor(20.0)).item()) < 1.5
    img = torch.randn(4, 3, 5, 5)                          # anything else: mean square
    torch.testing.assert_close(loss(img), img.pow(2).mean())


def test_info_on_a_gpt_shows_its_inputs_no_traceback():
    out = subprocess.run([sys.executable, "-m", "fusebench", "info", GPT],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "int64[1, 16]" in out.stdout


def test_repro_script_replays_a_gpt_cell(tmp_path):
    from fusebench.run.repro import script_text
    spec = _spec(WRONG)
    rec = {"status": "error", "spec": spec.to_dict(),
           "error": {"type": "RuntimeError", "message": "boom"}}
    path = tmp_path / "repro.py"
    path.write_text(script_text(rec, spec.to_dict(), [], "r.json"))
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1
    assert "[model called with: float32[4, 3]]" in out.stdout + out.stderr


@pytest.mark.skipif(importlib.util.find_spec("timm") is None, reason="timm is not installed")
def test_timm_model_runs_when_installed():
    rec = _run(_spec("timm:resnet18", "eager", bench="infer", batch_size=1, img_size=64))
    assert rec.status == "ok"
