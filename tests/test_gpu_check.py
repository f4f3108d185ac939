"""scripts/gpu_check.sh on a machine without a GPU: the script parses, and its summary builder
(scripts/gpu_summary.py) judges every target from saved results files: CPU ones (no data) and
GPU-like ones made by the factories (met / missed with the number)."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from fusebench.spec import CellSpec, Event
from tests.factories import kernel_record, model_record, write_results
from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]


gs = load_script("gpu_summary")


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_script_parses_and_installs_itself_when_needed():
    subprocess.run(["bash", "-n", str(ROOT / "scripts/gpu_check.sh")], check=True)
    text = (ROOT / "scripts/gpu_check.sh").read_text()
    assert "scripts/missing_deps.py" in text and "gpu_summary.py" in text
    assert ".whl/*.whl" in text and "exit 3" in text
    for needle in ("-m cudagraphs", "--compile-mode reduce-overhead", "--impl all",
                   "bfloat16", "efficientnet_b3", "--channels-last", "-m eager,fused,compile",
                   "--fused-bn-act triton", "scripts/gpu_kernels.py", "env"):
        assert needle in text, needle


def _verdicts(summary):
    return {t["name"]: (t["verdict"], t["value"]) for t in summary["targets"]}


def test_summary_of_a_cpu_results_file_is_no_data(tmp_path):
    recs = [model_record("efficientnet_b3", m, seed=i) for i, m in enumerate(("eager", "fused"))]
    recs.append(kernel_record("triton", shape=(32, 96, 56, 56), direction="fwdbwd"))
    write_results(tmp_path / "cpu.json", recs)
    assert gs.main([str(tmp_path), "--seconds", "12"]) == 0
    s = json.loads((tmp_path / "summary.json").read_text())
    v = _verdicts(s)
    assert v["ln2d_fwdbwd_fp32_pct_of_copy"] == ("no data", None)
    assert v["effnet_b3_modes_not_ok"] == ("no data", None)
    assert v["check_seconds"] == ("met", 12.0)
    assert len(s["models"]) == 2 and len(s["kernels"]) == 1


def _gpu_kernel(impl, dtype, pct_device, launch_bound=False, mode="eager"):
    r = kernel_record(impl, shape=(32, 96, 56, 56), direction="fwdbwd", dtype=dtype,
                      device="cuda", mode=mode)
    extra = {**r.extra, "device_ms": 0.1, "device_time_source": "graph_replay",
             "pct_of_copy_device": pct_device}
    ev = (Event("launch_bound", "cuda_timing", "step 4x device"),) if launch_bound else ()
    return r.replace(extra=extra, events=ev)


def test_summary_judges_gpu_figures(tmp_path):
    speed = {"eager": 100.0, "compile": 80.0, "fused": 90.0, "cudagraphs": 70.0}
    recs = [model_record("efficientnet_b3", m, base_ms=ms, device="cuda", seed=i,
                         extra={"energy_per_sample_j": 0.01})
            for i, (m, ms) in enumerate(speed.items())]
    recs.append(model_record("efficientnet_b3", "torchscript", device="cuda", status="error"))
    # the Triton BN+act variant: 0.6x eager's activation bytes, 1.25x its throughput
    recs.append(model_record("efficientnet_b3", "fused", base_ms=80.0, device="cuda",
                             activation_bytes=360_000_000, spec=CellSpec.for_model(
                                 "efficientnet_b3", "fused", batch_size=8, img_size=224,
                                 device="cuda", mode_options={"fused_bn_act": "triton"})))
    recs += [_gpu_kernel("triton", "float32", 91.0, launch_bound=True),
             _gpu_kernel("triton", "bfloat16", 70.0),
             _gpu_kernel("triton", "float32", 10.0).replace(status="mismatch")]
    write_results(tmp_path / "run" / "r.json", recs)
    s = gs.summarize(gs.records_under(tmp_path), seconds=500.0)
    v = _verdicts(s)
    assert v["ln2d_fwdbwd_fp32_pct_of_copy"] == ("met", 91.0)
    assert v["ln2d_fwdbwd_bf16_pct_of_copy"] == ("missed", 70.0)
    assert v["effnet_b3_modes_not_ok"] == ("missed", 1.0)
    verdict, ratio = v["effnet_b3_fused_over_compile"]
    assert verdict == "missed" and ratio == pytest.approx(80 / 90, rel=0.05)
    assert v["effnet_b3_cudagraphs_over_eager"][0] == "met"
    assert v["cells_with_energy"] == ("met", 4.0)
    assert v["check_seconds"] == ("missed", 500.0)
    assert v["triton_kernel_cells_not_ok"] == ("missed", 1.0)
    assert v["effnet_b3_fused_over_eager"][0] == "met"
    assert v["effnet_b3_fused_over_eager"][1] == pytest.approx(100 / 90, rel=0.05)
    assert v["effnet_b3_fused_activation_over_eager"] == ("missed", 1.0)
    by_mode = {f["mode"]: f for f in s["fused"]}
    tri = by_mode["fused[fused_bn_act=triton]"]
    assert tri["activation_over_eager"] == pytest.approx(0.6)
    assert tri["over_eager"] == pytest.approx(100 / 80, rel=0.05)
    assert tri["over_compile"] == pytest.approx(1.0, rel=0.05)
    assert any("NOT OK kernel ln2d triton float32" in line for line in gs.lines(s))
    assert s["launch_bound"] == ["triton/eager/float32"]
    assert any(line.startswith("     met") for line in gs.lines(s))


def test_summary_refuses_a_missing_folder(tmp_path, capsys):
    assert gs.main([str(tmp_path / "nope")]) == 2
    assert "not a folder" in capsys.readouterr().err


def test_kernel_table_shows_device_time_only_for_cuda_cells():
    from rich.console import Console

    from fusebench.render.kernel_table import kernel_table

    def text(recs):
        con = Console(width=200, record=True)
        con.print(kernel_table(recs, wide=True))
        return con.export_text()
    gpu = text([_gpu_kernel("triton", "float32", 91.0), _gpu_kernel("function", "float32", 40.0)])
    assert "device ms" in gpu and "91%" in gpu
    cpu = text([kernel_record("permute"), kernel_record("function")])
    assert "device ms" not in cpu
