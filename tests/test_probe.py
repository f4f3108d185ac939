"""The probe (run/probe.py, cell/probe.py): user code is loaded in a child process, never in the
CLI; what a plugin registers still shows in every command. The hostile cases (exit, hang,
raise at import; a broken plugin in each command) are in test_bad_input.py, where they count."""
from __future__ import annotations

import json
import sys
import textwrap

import pytest

from fusebench.cli import main
from fusebench.errors import UsageError

PLUGIN = textwrap.dedent('''
    print("plugin says hello")                 # must never reach the CLI's stdout
    import torch
    from fusebench.kernels.registry import register_impl
    from fusebench.models.registry import register_model
    from fusebench.modes import Mode, register_mode

    @register_mode
    class Plugged(Mode):
        name = "plugged"
        description = "a plugin's mode"
        dist_unsupported = {"fsdp2": "not sharded"}

        def available(self, options, device="cpu"):
            return False, "plugged needs a widget"

        def prepare(self, model, example_inputs, options, events):
            return model

    @register_impl("ln2d", "plugged_ln")
    def plugged_ln(x, weight, bias, eps):
        """a plugin's ln2d impl"""
        return torch.nn.functional.layer_norm(
            x.permute(0, 2, 3, 1), x.shape[1:2], weight, bias, eps).permute(0, 3, 1, 2)

    @register_model(family="plugged", train_size=32, infer_size=32)
    def plugged_net():
        """a plugin's model"""
        return torch.nn.Conv2d(3, 4, 3)
''')


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    p = tmp_path / "my_plugin.py"
    p.write_text(PLUGIN)
    monkeypatch.setenv("FUSEBENCH_PLUGINS", str(p))
    yield p
    monkeypatch.delenv("FUSEBENCH_PLUGINS", raising=False)
    main(["list", "modes", "--json"])          # drops the stand-ins for the next test


def _user_modules(path) -> list[str]:
    return [m for m, mod in list(sys.modules.items())
            if getattr(mod, "__file__", None) and str(mod.__file__) == str(path.resolve())]


def test_plugin_entries_show_in_list_and_env_and_never_load_here(plugin, capfd):
    """One probe (answers are cached per process) serves list modes/kernels/models and env;
    the plugin's print goes to stderr; the CLI process never imports the plugin."""
    rows, errs = {}, []
    for what in ("modes", "kernels", "models"):
        assert main(["list", what, "--json"]) == 0
        out, err = capfd.readouterr()
        rows[what] = {r["name"]: r for r in json.loads(out)}      # stdout is only JSON
        errs.append(err)
    assert "plugin says hello" in errs[0]              # the first probe ran the plugin...
    assert "plugin says hello" not in errs[1] + errs[2]     # ...the others reused its answer
    mode = rows["modes"]["plugged"]
    assert not mode["available"] and mode["reason"] == "plugged needs a widget"
    assert rows["kernels"]["ln2d/plugged_ln"]["description"] == "a plugin's ln2d impl"
    assert rows["models"]["plugged_net"]["family"] == "plugged"
    assert main(["env", "--json"]) == 0
    env = json.loads(capfd.readouterr()[0])["availability"]
    assert env["modes"]["plugged"] == {"available": False, "reason": "plugged needs a widget"}
    assert env["kernels"]["ln2d"]["plugged_ln"]["available"] is True
    assert _user_modules(plugin) == []


def test_stand_ins_go_when_plugins_go(plugin, monkeypatch, capsys):
    assert main(["list", "modes", "--json"]) == 0
    assert "plugged" in {r["name"] for r in json.loads(capsys.readouterr().out)}
    monkeypatch.delenv("FUSEBENCH_PLUGINS")
    assert main(["list", "modes", "--json"]) == 0
    assert "plugged" not in {r["name"] for r in json.loads(capsys.readouterr().out)}


def test_plugin_mode_and_impl_are_planned_by_name(plugin):
    from fusebench.run.kernel_plan import KernelRequest, plan_kernel
    from fusebench.run.plan import RunRequest, plan_run
    specs = plan_kernel(KernelRequest("ln2d", impls="plugged_ln,permute", shapes=("2,4,3,3",),
                                      modes="plugged"))
    assert [(s.kernel.impl, s.mode) for s in specs] == [("plugged_ln", "plugged"),
                                                        ("permute", "plugged")]
    specs = plan_run(RunRequest(models="plugged_net", modes="eager,plugged", batch_sizes="2"))
    assert [(s.model.name, s.mode) for s in specs] == [("plugged_net", "eager"),
                                                       ("plugged_net", "plugged")]
    from fusebench.run.distributed import supports   # the stand-in carries dist support
    assert supports("plugged", "fsdp2")[0] is False
    assert _user_modules(plugin) == []


def test_model_file_is_checked_in_the_probe_not_here(tmp_path):
    """plan_run checks a model file's kwargs and sizes, but the file runs only in the probe."""
    from fusebench.run.plan import RunRequest, plan_run
    f = tmp_path / "net.py"
    f.write_text("import torch\n\ndef make(width: int = 4):\n"
                 "    return torch.nn.Conv2d(3, width, 3)\n\nmake.min_size = 8\n")
    with pytest.raises(UsageError, match="unknown model kwarg 'depth'"):
        plan_run(RunRequest(models=f"{f}:make", model_kwargs=("depth=2",)))
    with pytest.raises(UsageError, match="--img-size >= 8"):
        plan_run(RunRequest(models=f"{f}:make", img_sizes="4"))
    specs = plan_run(RunRequest(models=f"{f}:make", model_kwargs=("width=8",), modes="eager"))
    assert specs[0].model.kwargs == (("width", "8"),)
    assert _user_modules(f) == []


def test_info_of_a_file_comes_from_the_probe(tmp_path, capfd):
    f = tmp_path / "loud.py"
    f.write_text("print('loud at import')\nimport torch\n\ndef make():\n"
                 "    print('loud at build')\n    return torch.nn.Conv2d(3, 4, 3)\n")
    assert main(["info", f"{f}:make", "--json"]) == 0
    out, err = capfd.readouterr()
    assert json.loads(out)["params"] == 3 * 4 * 9 + 4
    assert "loud at import" in err and "loud at build" in err
    assert _user_modules(f) == []


def test_print_and_chdir_at_import_cannot_touch_the_run(tmp_path, monkeypatch, capfd):
    """`run --json` with a model file that prints and changes directory at import: stdout is
    the results document only, and the results land where the CLI resolved --out."""
    f = tmp_path / "wanders.py"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    f.write_text(f"import os\nprint('wandering off')\nos.chdir({str(elsewhere)!r})\n"
                 "import torch\n\ndef make():\n    return torch.nn.Conv2d(3, 4, 3)\n\n"
                 "make.input_size = (3, 8, 8)\n")
    monkeypatch.chdir(tmp_path)
    code = main(["run", f"{f}:make", "-m", "eager", "-b", "2", "--warmup", "0", "--steps", "1",
                 "--no-check", "--out", "res", "--json"])
    out, err = capfd.readouterr()
    assert code == 0, err[-2000:]
    assert json.loads(out)["records"][0]["status"] == "ok"
    assert "wandering off" in err
    assert len(list((tmp_path / "res").glob("*.json"))) == 1
    assert not list(elsewhere.iterdir())


@pytest.mark.parametrize("value,cell,want", [(None, None, 60.0), (None, 5.0, 5.0),
                                             ("7", 900.0, 7.0), ("7", 2.0, 2.0)])
def test_probe_timeout_is_the_smaller_limit(monkeypatch, value, cell, want):
    from fusebench.run.probe import TIMEOUT_ENV, probe_timeout
    if value is None:
        monkeypatch.delenv(TIMEOUT_ENV, raising=False)
    else:
        monkeypatch.setenv(TIMEOUT_ENV, value)
    assert probe_timeout(cell) == want


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_bad_probe_timeout_is_a_usage_error(monkeypatch, value):
    from fusebench.run.probe import TIMEOUT_ENV, probe_timeout
    monkeypatch.setenv(TIMEOUT_ENV, value)
    with pytest.raises(UsageError, match=TIMEOUT_ENV):
        probe_timeout()
