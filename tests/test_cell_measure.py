"""What a model cell measures besides time (issue 13): the threads the worker really used,
other processes' CPU use around the timed steps, peak memory windows, and the correctness
reference when float64 does not fit."""
from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fusebench.cell import model_cell, model_check
from fusebench.cell.model_cell import run_cell
from fusebench.cli import app
from fusebench.spec import CellSpec
from tests.helpers import ASSETS, TINY

PROBE = f"{ASSETS / 'probe_models.py'}:threads_probe"


def _run(model=TINY, mode="eager", **kw):
    spec = CellSpec.for_model(model, mode, **{**dict(batch_size=4, warmup=1, steps=3,
                                                      threads=1), **kw})
    return run_cell(spec, lambda phase: None)


# ----- threads (issue 13 part 1) --------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 2])
def test_threads_reach_the_worker_and_the_record(monkeypatch, tmp_path, threads):
    probe = tmp_path / "threads.txt"
    monkeypatch.setenv("FUSEBENCH_TEST_THREADS_FILE", str(probe))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")     # what --threads must override
    res = CliRunner().invoke(app, ["run", PROBE, "-m", "eager", "-b", "2", "--steps", "2",
                                   "--warmup", "1", "--threads", str(threads), "--json",
                                   "--no-save", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)["records"][0]
    seen = {int(line) for line in probe.read_text().split()}
    assert seen == {threads}                       # what the model saw in every call
    assert rec["spec"]["threads"] == threads
    used = rec["extra"]["threads"]
    assert used["requested"] == threads and used["intra_op"] == threads
    assert used["env"] == {"OMP_NUM_THREADS": "3"} and used["inter_op"] >= 1


# ----- contention (issue 13 part 5) -----------------------------------------------------------

def test_contention_fields_are_recorded():
    rec = _run()
    c = rec.extra["contention"]
    import torch
    assert c["window_s"] > 0 and c["worker_cores"] == min(torch.get_num_threads(),
                                                          c["cpu_count"])
    assert {"others_frac", "others_frac_min", "resolution_s", "steal_frac", "load1",
            "others_cpu_s"} <= set(c)
    # the tiny model's steps take milliseconds: the window was held open until it could resolve
    from fusebench.measure.contention import window_needed_s
    assert c["window_s"] >= window_needed_s(c["worker_cores"], c["cpu_count"])


def test_contended_window_adds_an_event(monkeypatch):
    busy = {"window_s": 1.0, "worker_cores": 1, "cpu_count": 2, "others_cpu_s": 0.5,
            "others_frac": 0.5, "steal_frac": 0.0, "load1": 3.0}

    class Busy(model_cell.CpuWindow):
        def result(self, threads):
            return dict(busy)
    monkeypatch.setattr(model_cell, "CpuWindow", Busy)
    rec = _run()
    events = [e for e in rec.events if e.category == "contention"]
    assert len(events) == 1 and events[0].source == "fusebench"
    assert "other processes used 50%" in events[0].message
    assert rec.extra["contention"]["others_frac"] == 0.5


# ----- peak memory windows (issue 13 part 2) ---------------------------------------------------

def test_first_call_peak_is_its_own_field_and_check_is_outside_the_window(monkeypatch):
    rec = _run(mode="aot")
    assert rec.extra["peak_mem_first_call_bytes"] is not None
    assert rec.peak_mem_bytes is not None
    # the float64 reference runs between the windows: poison it with a big allocation and the
    # timed peak must not see it
    big = []
    real = model_check.ReferenceRunner._float64

    def hog(self, *args):
        import torch
        big.append(torch.ones(64 << 20, dtype=torch.uint8))   # 64 MiB, touched
        try:
            return real(self, *args)
        finally:
            big.clear()
    monkeypatch.setattr(model_check.ReferenceRunner, "_float64", hog)
    hogged = _run(mode="aot")
    assert hogged.status == "ok"
    assert hogged.peak_mem_bytes < (32 << 20), hogged.peak_mem_bytes


# ----- float32 reference when float64 does not fit (issue 13 last item) ------------------------

def test_float32_reference_uses_eagers_own_error_on_a_float64_sub_batch(monkeypatch):
    monkeypatch.setattr(model_check, "float64_batch", lambda device, ws, batch: batch // 2)
    rec = _run(mode="aot")
    assert rec.status == "ok", rec.correctness
    refs = rec.extra["correctness_reference"]
    assert [r["reference"] for r in refs] == ["float32", "float32"]
    assert all(r["tol_grad"] is not None for r in refs)
    assert "sub-batch of 2" in rec.correctness.detail


def test_float32_reference_still_catches_a_wrong_gradient(monkeypatch, fault_modes):
    monkeypatch.setattr(model_check, "float64_batch", lambda device, ws, batch: batch // 2)
    rec = _run(mode="test_corrupt_after_2")
    assert rec.status == "mismatch"
    assert "grad rel err" in rec.correctness.detail


def test_no_float64_room_at_all_says_bare_tolerance(monkeypatch):
    monkeypatch.setattr(model_check, "float64_batch", lambda device, ws, batch: 0)
    rec = _run(mode="aot")
    assert "bare tolerance" in rec.correctness.detail
    assert rec.extra["correctness_reference"][0]["tol_out"] == 1e-4


def test_float64_batch_halves_until_it_fits(monkeypatch):
    import torch
    monkeypatch.setattr(model_check, "_float64_room", lambda device: 1000.0)
    cpu = torch.device("cpu")
    assert model_check.float64_batch(cpu, 100, 8) == 8          # 200 < 1000
    assert model_check.float64_batch(cpu, 1000, 8) == 2         # 2000 * 2/8 = 500
    assert model_check.float64_batch(cpu, 10_000, 8) == 0


# ----- a failed check repeated once on a perturbed batch ----------------------------------------

def test_an_input_specific_miss_passes_on_the_perturbed_batch(fault_modes):
    """Wrong on the cell's own batch only (as a value rounded across hardswish's kink is): both
    checks fail there, pass on the perturbed batch, and the record and an event say so."""
    rec = _run(mode="test_wrong_on_one_batch")
    assert rec.status == "ok", rec.correctness.detail
    detail = rec.correctness.detail
    assert detail.count("the first failure did not repeat") == 2, detail
    assert "grad rel err" in detail                       # the first failure is kept
    assert any(e.category == "check_repeated" for e in rec.events), rec.events


def test_a_wrong_gradient_fails_the_repeated_check_too(fault_modes):
    rec = _run(mode="test_corrupt_after_2")
    assert rec.status == "mismatch"
    assert "first: ok" in rec.correctness.detail and "(failed again)" in rec.correctness.detail


GPT = f"{ASSETS / 'tiny_gpt.py'}:make"


def test_a_token_models_miss_is_repeated_at_moved_weights(fault_modes):
    """Token ids cannot be perturbed: the failed first check is repeated with the weights
    moved instead (a ReLU model's kink flips are weight-specific too), and it passes there."""
    rec = _run(model=GPT, mode="test_wrong_at_first_weights")
    assert rec.status == "ok", rec.correctness.detail
    detail = rec.correctness.detail
    assert "at perturbed weights: ok" in detail and "did not repeat" in detail, detail
    assert "grad rel err" in detail


def test_a_token_models_wrong_gradient_fails_at_moved_weights_too(fault_modes):
    rec = _run(model=GPT, mode="test_corrupt_after_2")
    assert rec.status == "mismatch"
    assert "at perturbed weights" in rec.correctness.detail
    assert "(failed again)" in rec.correctness.detail


def test_moved_weights_move_every_float_parameter_a_little_and_deterministically():
    import copy

    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8))
    before = copy.deepcopy(model.state_dict())
    twin = copy.deepcopy(model)
    state = model_cell._moved_weights(model)
    assert state.keys() == before.keys()
    for k, v in state.items():           # moved by ~1e-3 of each value; a zero stays zero
        nz = before[k] != 0
        rel = ((v - before[k])[nz] / before[k][nz]).abs()
        assert torch.equal(v[~nz], before[k][~nz]) and (rel.numel() == 0 or 0 < rel.max() < 1e-2), k
    assert any((before[k] != 0).any() for k in before)
    assert all(torch.equal(v, twin_v) for v, twin_v in
               zip(state.values(), model_cell._moved_weights(twin).values()))


def test_a_passing_check_is_not_repeated():
    rec = _run(mode="aot")
    assert rec.status == "ok" and "perturbed" not in rec.correctness.detail
    assert not any(e.category == "check_repeated" for e in rec.events)


def test_perturbed_inputs_keep_layout_and_dtype_and_leave_token_ids_alone():
    import torch
    from fusebench.models.inputs import ModelInputs
    x = torch.randn(2, 3, 4, 5).contiguous(memory_format=torch.channels_last)
    ids = torch.randint(0, 9, (2, 4))
    (p, same), = [ModelInputs((x, ids)).perturbed().args]
    assert p.is_contiguous(memory_format=torch.channels_last) and p.dtype == x.dtype
    assert 0 < (p - x).abs().max() < 1e-2 * x.std() and same is ids
    assert ModelInputs((ids,)).perturbed() is None


# ----- input gradients and frozen branches in the correctness check ---------------------------

def test_steady_check_compares_input_gradients_where_the_mode_allows(fault_modes):
    rec = _run(mode="test_wrong_input_grad")
    assert rec.status == "mismatch", rec.correctness
    assert "worst: input 0" in rec.correctness.detail
    first, steady = rec.extra["correctness_reference"]
    assert first["input_grads"] is None and steady["input_grads"] == 1
    unasked = _run(mode="test_wrong_input_grad_unasked")   # parameters alone cannot see it
    assert unasked.status == "ok", unasked.correctness
    assert [r["input_grads"] for r in unasked.extra["correctness_reference"]] == [None, None]


def test_fused_mode_checks_input_gradients():
    rec = _run(mode="fused")
    assert rec.status == "ok", rec.correctness
    assert rec.extra["correctness_reference"][1]["input_grads"] == 1
    assert "input gradients too: 1" in rec.correctness.detail


def test_a_frozen_branch_without_gradients_passes():
    # a teacher run under no_grad: its trainable parameters get no gradient in eager either
    rec = _run(model=f"{ASSETS / 'probe_models.py'}:distill", mode="fused")
    assert rec.status == "ok", rec.correctness
    assert rec.correctness.max_rel_err_grad is not None


def test_input_gradients_of_a_model_that_changes_its_input_in_place():
    rec = _run(model=f"{ASSETS / 'probe_models.py'}:scales_in_place", mode="fused")
    assert rec.status == "ok", rec.correctness
    assert rec.extra["correctness_reference"][1]["input_grads"] == 1


# ----- models that draw random numbers: a live dropout ----------------------------------------

DROPOUT = f"{ASSETS / 'probe_models.py'}:live_dropout"
# draws dropout's masks its own way, as inductor does, and compiles in about a second
DECOMP = (("compile_backend", "aot_eager_decomp_partition"),)


def _messages(rec) -> list[str]:
    return [e.message for e in rec.events]


@pytest.mark.parametrize("backend", ["aot_eager_decomp_partition", "aot_eager"])
def test_a_compiled_plan_on_a_model_drawing_random_numbers_is_checked_through_a_twin(backend):
    # aot_eager keeps aten's random ops: its twin is the same plan compiled again
    rec = _run(model=DROPOUT, mode="compile", mode_options=(("compile_backend", backend),))
    assert rec.status == "ok", rec.correctness
    assert rec.correctness.detail.count("(through a twin)") == 2
    drawn = [m for m in _messages(rec) if "draws random numbers" in m]
    assert drawn and "aten.bernoulli_ x1" in drawn[0] and "aten.randn_like x1" in drawn[0]
    assert "1 unique graphs compiled" in _messages(rec)   # the twin's compile is not the plan's


def test_the_same_check_without_the_twin_fails(monkeypatch):
    from fusebench.modes.compile import Compile
    monkeypatch.setattr(Compile, "check_twin", lambda self: None)
    rec = _run(model=DROPOUT, mode="compile", mode_options=DECOMP)
    assert rec.status == "mismatch", rec.correctness


@pytest.mark.parametrize("model, mode, options", [
    (DROPOUT, "aot", ()), (DROPOUT, "fused", ()), (TINY, "compile", DECOMP)],
    ids=["aot", "fused", "compile-no-random-ops"])
def test_other_plans_are_checked_as_they_are(model, mode, options):
    rec = _run(model=model, mode=mode, mode_options=options)
    assert rec.status == "ok", rec.correctness
    assert "twin" not in rec.correctness.detail
    assert not any("draws random numbers" in m for m in _messages(rec))


@pytest.mark.slow
def test_inductor_on_a_live_dropout_passes_through_its_twin():
    # inductor replaces aten's random ops by its own generator's: the plan alone fails (HF
    # BERT and GPT-2 did, at 0.4-1.0 relative error)
    rec = _run(model=DROPOUT, mode="compile")
    assert rec.status == "ok", rec.correctness
    assert rec.correctness.detail.count("(through a twin)") == 2
    assert "1 unique graphs compiled" in _messages(rec)


# ----- subnormals flushed by something the cell loaded ----------------------------------------

FLUSHING = ("import torch\n"
            "class M(torch.nn.Module):\n"
            "    # stands in for a library built with -ffast-math (torch 2.4's inductor kernels)\n"
            "    def __init__(self):\n        super().__init__()\n"
            "        self.fc = torch.nn.Linear(4, 4)\n"
            "    def forward(self, x):\n"
            "        torch.set_flush_denormal({flush})\n        return self.fc(x)\n"
            "def make():\n    return M()\n"
            "def example_inputs(b, device, dtype):\n"
            "    return (torch.randn(b, 4, dtype=dtype),)\n")


def test_flushes_subnormals_reads_the_cpus_mode():
    import torch
    from fusebench.measure.fpstate import flushes_subnormals
    assert not flushes_subnormals()
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU has no flush-to-zero mode torch can set")
    try:
        assert flushes_subnormals()
    finally:
        torch.set_flush_denormal(False)
    assert not flushes_subnormals()


@pytest.mark.parametrize("flush", [True, False])
def test_a_cell_that_leaves_subnormals_flushing_says_so(tmp_path, flush):
    import torch
    from fusebench.cell.worker import run
    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU has no flush-to-zero mode torch can set")
    f = tmp_path / "flushing.py"
    f.write_text(FLUSHING.format(flush=flush))
    spec = CellSpec.for_model(f"{f}:make", "eager", batch_size=2, warmup=1, steps=2)
    rec = run(spec.to_dict())
    assert rec["status"] == "ok", rec.get("error")
    said = [e["message"] for e in rec["events"] if e["category"] == "fp_state"]
    assert len(said) == flush, rec["events"]
    if flush:
        assert "since the cell ran" in said[0] and "-ffast-math" in said[0]
