"""Model zoo, model sources, FLOP counting and the list/info commands."""
from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from typer.testing import CliRunner

from fusebench.cli import app
from fusebench.errors import UsageError
from fusebench.kernels import get_impl, list_impls
from fusebench.measure.flops import count_params, forward_gflops_per_sample
from fusebench.models import create_model, get_model_info, list_models
from fusebench.models.layers import LayerNorm2d, make_divisible
from fusebench.models.source import coerce_kwargs, parse_model_kwargs, resolve_model

# timm / torchvision reference counts with 1000 classes (same architecture in both libraries)
REFERENCE_PARAMS = {
    "efficientnet_b0": 5_288_548,
    "efficientnet_b1": 7_794_184,
    "efficientnet_b2": 9_109_994,
    "efficientnet_b3": 12_233_232,
    "efficientnet_b4": 19_341_616,
    "efficientnet_b5": 30_389_784,
    "efficientnet_b6": 43_040_704,
    "efficientnet_b7": 66_347_960,
    "convnext_tiny": 28_589_128,
    "convnext_small": 50_223_688,
    "convnext_base": 88_591_464,
}

ALL_MODELS = list_models()
runner = CliRunner()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny shapes gain nothing from intra-op threads, and on a busy machine OpenMP spin-waits
    made the zoo forward/backward tests ~20x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ----- zoo ------------------------------------------------------------------------------------

def test_zoo_has_both_families():
    assert {f"efficientnet_b{i}" for i in range(8)} <= set(ALL_MODELS)
    assert {f"convnext_{v}" for v in ("atto", "femto", "pico", "nano", "tiny", "small",
                                      "base")} <= set(ALL_MODELS)


@pytest.mark.parametrize("name", sorted(REFERENCE_PARAMS))
def test_param_count_matches_reference(name):
    with torch.device("meta"):            # counting needs shapes only: no memory, no init cost
        model = create_model(name)
    assert count_params(model) == REFERENCE_PARAMS[name]


def test_make_divisible():
    assert make_divisible(32 * 1.1) == 32        # 35.2 -> 32 (within 90%)
    assert make_divisible(16 * 1.1) == 16
    assert make_divisible(1280 * 1.1) == 1408
    assert make_divisible(10) == 16              # 8 would lose more than 10%


@pytest.mark.parametrize("name", ALL_MODELS)
def test_forward_backward_channels_last(name):
    torch.manual_seed(0)
    model = create_model(name, num_classes=10)
    x = torch.randn(2, 3, 32, 32)
    y = model(x)                                   # train mode: BN batch stats, dropout
    assert y.shape == (2, 10)
    y.square().mean().backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert all(torch.isfinite(g).all() for g in grads)

    model.eval()
    with torch.no_grad():
        ref = model(x)
        cl = model(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(cl, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("impl", list_impls("ln2d"))
def test_convnext_ln_impls_agree(impl):
    ok, reason = get_impl("ln2d", impl).available("cpu")
    if not ok:
        pytest.skip(f"ln2d/{impl} unavailable: {reason}")
    torch.manual_seed(0)
    ref = create_model("convnext_atto", num_classes=10).eval()
    with torch.no_grad():   # layer scale 1 instead of 1e-6 so every block's LN really matters
        for name, p in ref.named_parameters():
            if name.endswith("gamma"):
                p.fill_(1.0)
    model = create_model("convnext_atto", num_classes=10, ln_impl=impl).eval()
    model.load_state_dict(ref.state_dict())
    norms = [m for m in model.modules() if isinstance(m, LayerNorm2d)]
    assert norms and all(m.impl == impl for m in norms)
    x = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = ref(x)
        tol = 1e-4 * expected.abs().max().item()     # float32 through 14 LNs (sqm: one-pass var)
        torch.testing.assert_close(model(x), expected, rtol=1e-4, atol=tol)
        xcl = x.contiguous(memory_format=torch.channels_last)
        torch.testing.assert_close(model(xcl), expected, rtol=1e-4, atol=tol)


def test_unknown_ln_impl_is_usage_error():
    with pytest.raises(UsageError, match="unknown ln2d impl 'nope'.*permute"):
        create_model("convnext_atto", ln_impl="nope")


def test_default_sizes():
    assert get_model_info("efficientnet_b3").input_size("train") == (3, 288, 288)
    assert get_model_info("efficientnet_b3").input_size("infer") == (3, 320, 320)
    assert get_model_info("convnext_tiny").input_size("train") == (3, 224, 224)
    assert get_model_info("convnext_tiny").input_size("infer") == (3, 288, 288)


# ----- model sources --------------------------------------------------------------------------

def test_resolve_zoo():
    src = resolve_model("efficientnet_b0")
    assert (src.name, src.origin, src.family) == ("efficientnet_b0", "zoo", "efficientnet")
    assert src.input_size("train") == (3, 224, 224)
    assert src.input_size("infer", img_size=64) == (3, 64, 64)
    assert src.min_size == 32


def test_resolve_unknown_zoo_name_suggests():
    with pytest.raises(UsageError, match="did you mean efficientnet_b"):
        resolve_model("efficientnet_b9")


@pytest.mark.parametrize("size,msg", [(0, "must be positive"), (-3, "must be positive"),
                                      (16, "efficientnet_b0 needs --img-size >= 32")])
def test_validate_img_size(size, msg):
    src = resolve_model("efficientnet_b0")
    with pytest.raises(UsageError, match=msg):
        src.validate_img_size(size)
    with pytest.raises(UsageError, match=msg):
        src.input_size("train", img_size=size)


GOOD_FILE = '''
import torch.nn as nn

class Tiny(nn.Module):
    def __init__(self, width=4, num_classes=3):
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.fc = nn.Linear(width, num_classes)
    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))

def make(width: int = 4, num_classes: int = 3):
    """A tiny conv net."""
    return Tiny(width, num_classes)
make.input_size = (3, 16, 16)

def make_sized():
    m = Tiny()
    m.input_size = (3, 8, 12)
    return m

def broken():
    raise RuntimeError("weights file missing\\nsecond line")

def not_a_module():
    return 42

NOT_CALLABLE = 3
'''


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "my_models.py"
    path.write_text(GOOD_FILE)
    return path


def test_file_model_builds(model_file):
    src = resolve_model(f"{model_file}:make")
    assert src.origin == "file"
    assert src.description == "A tiny conv net."
    model = src.build(**coerce_kwargs(src.factory, {"width": "6", "num_classes": "5"}))
    assert model(torch.randn(2, 3, 16, 16)).shape == (2, 5)
    assert src.input_size("train") == (3, 16, 16)              # from the factory attribute
    assert src.input_size("infer", img_size=20) == (3, 20, 20)


def test_file_model_input_size_from_module(model_file):
    src = resolve_model(f"{model_file}:make_sized")
    assert src.input_size("train") == (3, 224, 224)            # unknown before building
    assert src.input_size("train", model=src.build()) == (3, 8, 12)


def test_same_file_imported_once(model_file):
    a = resolve_model(f"{model_file}:make")
    b = resolve_model(f"{model_file}:make_sized")
    assert a.factory.__module__ == b.factory.__module__


def test_two_files_with_same_name_do_not_clash(tmp_path):
    for sub, width in (("a", 2), ("b", 7)):
        (tmp_path / sub).mkdir()
        (tmp_path / sub / "m.py").write_text(f"import torch.nn as nn\n"
                                              f"def make():\n    return nn.Linear({width}, 1)\n")
    wa = resolve_model(f"{tmp_path / 'a' / 'm.py'}:make").build().in_features
    wb = resolve_model(f"{tmp_path / 'b' / 'm.py'}:make").build().in_features
    assert (wa, wb) == (2, 7)


@pytest.mark.parametrize("spec,msg", [
    ("{dir}/missing.py:make", "not found"),
    ("{dir}/my_models.txt:make", "not a .py file"),
    ("{dir}/my_models.py:", "expected path/to/file.py:factory"),
    ("{dir}/my_models.py:mkae", "did you mean make"),
    ("{dir}/my_models.py:NOT_CALLABLE", "not callable"),
])
def test_file_model_resolve_errors(model_file, spec, msg):
    with pytest.raises(UsageError, match=msg):
        resolve_model(spec.format(dir=model_file.parent))


def test_file_model_syntax_error(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("def make(:\n    pass\n")
    with pytest.raises(UsageError, match=r"syntax error in .*bad\.py line 1"):
        resolve_model(f"{path}:make")


def test_file_model_import_error(tmp_path):
    path = tmp_path / "bad_import.py"
    path.write_text("import not_a_real_module_xyz\n")
    with pytest.raises(UsageError, match="importing .* failed: ModuleNotFoundError"):
        resolve_model(f"{path}:make")


def test_file_model_build_errors(model_file):
    src = resolve_model(f"{model_file}:broken")                # resolving never builds
    with pytest.raises(UsageError, match="failed to build: RuntimeError: weights file missing$"):
        src.build()
    with pytest.raises(UsageError, match="returned int, not an nn.Module"):
        resolve_model(f"{model_file}:not_a_module").build()
    with pytest.raises(UsageError, match="unexpected keyword"):
        resolve_model(f"{model_file}:make").build(depth=3)


@pytest.mark.skipif(importlib.util.find_spec("timm") is not None, reason="timm is installed")
def test_timm_missing_message():
    with pytest.raises(UsageError, match="^timm is not installed; pip install timm$"):
        resolve_model("timm:resnet18")


# ----- kwargs from the CLI --------------------------------------------------------------------

def test_parse_and_coerce_kwargs():
    factory = get_model_info("convnext_atto").factory
    raw = parse_model_kwargs(["ln_impl=sqm", "num_classes=10", "drop_path_rate=1e-1"])
    assert coerce_kwargs(factory, raw) == {"ln_impl": "sqm", "num_classes": 10,
                                           "drop_path_rate": 0.1}
    with pytest.raises(UsageError, match="expects int"):
        coerce_kwargs(factory, {"num_classes": "ten"})
    with pytest.raises(UsageError, match="unknown model kwarg 'num_class'"):
        coerce_kwargs(factory, {"num_class": "10"})
    with pytest.raises(UsageError, match="expected KEY=VALUE"):
        parse_model_kwargs(["ln_impl"])


def test_coerce_kwargs_bool_literal_and_var_kwargs():
    def f(flag=False, shape=None, **extra):
        pass
    assert coerce_kwargs(f, {"flag": "true", "shape": "(1, 2)", "other": "abc",
                             "n": "3"}) == {"flag": True, "shape": (1, 2), "other": "abc", "n": 3}
    with pytest.raises(UsageError, match="true/false"):
        coerce_kwargs(f, {"flag": "maybe"})


# ----- flops ----------------------------------------------------------------------------------

def test_flops_linear_exact():
    model = torch.nn.Linear(16, 8)
    assert forward_gflops_per_sample(model, torch.randn(4, 16)) == pytest.approx(2 * 16 * 8 / 1e9)
    assert count_params(model) == 16 * 8 + 8


def test_flops_conv_exact():
    model = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
    gflops = forward_gflops_per_sample(model, torch.randn(2, 3, 5, 5))
    assert gflops == pytest.approx(2 * 3 * 4 * 9 * 25 / 1e9)      # 2 * MACs per sample


# ----- commands -------------------------------------------------------------------------------

def test_list_models_pattern():
    r = runner.invoke(app, ["list", "models", "convnext_*"])
    assert r.exit_code == 0, r.output
    names = [line.split()[0] for line in r.stdout.splitlines() if line.strip()]
    assert names == list_models("convnext_*")


def test_list_models_json():
    r = runner.invoke(app, ["list", "models", "efficientnet_b*", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == list_models("efficientnet_b*")
    assert rows[3]["train_size"] == 288 and rows[3]["infer_size"] == 320


def test_list_kernels():
    r = runner.invoke(app, ["list", "kernels", "--json"])
    assert r.exit_code == 0, r.output
    names = {row["name"] for row in json.loads(r.stdout)}
    from fusebench.kernels import families
    assert {f"{f}/{i}" for f in families() for i in list_impls(f)} == names


def test_list_modes():
    from fusebench.modes import list_modes
    r = runner.invoke(app, ["list", "modes", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["name"] for row in rows] == list_modes()
    assert all(isinstance(row["available"], bool) for row in rows)


def test_info_json():
    r = runner.invoke(app, ["info", "convnext_atto", "--json", "--model-kwarg", "num_classes=10",
                            "--model-kwarg", "ln_impl=sqm"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.stdout)
    assert info["family"] == "convnext"
    assert info["params"] == count_params(create_model("convnext_atto", num_classes=10))
    assert info["train_input_size"] == [3, 224, 224]
    assert info["infer_input_size"] == [3, 288, 288]
    assert 0 < info["gflops_per_sample"] < 5


def test_info_table():
    r = runner.invoke(app, ["info", "efficientnet_b0"])
    assert r.exit_code == 0, r.output
    assert "5,288,548" in r.stdout


@pytest.mark.parametrize("args,msg", [
    (["info", "efficientnet_b9"], "unknown model 'efficientnet_b9'"),
    (["info", "convnext_atto", "--model-kwarg", "ln_impl=bogus"], "unknown ln2d impl"),
    (["info", "convnext_atto", "--model-kwarg", "num_classes"], "expected KEY=VALUE"),
    (["info", "no_such_file.py:make"], "not found"),
])
def test_info_bad_input_is_one_line_exit_2(args, msg):
    r = runner.invoke(app, args)
    assert r.exit_code == 2
    assert msg in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert "Traceback" not in r.output


# torch 2.13's own convolution_backward formula ignores groups in grad_weight; ours must not.
@pytest.mark.parametrize("groups", [1, 2, 8], ids=["dense", "grouped", "depthwise"])
@pytest.mark.parametrize("input_grad", [True, False], ids=["dx+dw", "dw-only"])
def test_train_step_flops_count_grouped_conv_backward_by_hand(groups, input_grad):
    from fusebench.measure.flops import step_flops
    n, c_in, c_out, k, hw = 2, 8, 16, 3, 5
    conv = torch.nn.Conv2d(c_in, c_out, k, padding=1, groups=groups, bias=False)
    x = torch.randn(n, c_in, hw, hw, requires_grad=input_grad)
    # one multiply-add per (output element, input channel of its group, kernel tap)
    fwd_by_hand = 2 * n * c_out * hw * hw * (c_in // groups) * k * k
    fwd, total = step_flops(lambda: conv(x).sum(), lambda loss: loss.backward())
    assert fwd == fwd_by_hand
    # backward = one forward's worth for grad_weight, and one more for grad_input if asked
    assert total == fwd_by_hand * (3 if input_grad else 2)


def test_convnext_train_step_flops_near_three_forwards():
    from fusebench.measure.flops import step_flops
    model = get_model_info("convnext_atto").factory().eval()
    x = torch.randn(1, 3, 64, 64)
    fwd, total = step_flops(lambda: model(x).sum(), lambda loss: loss.backward())
    # the stem conv's input needs no gradient, so slightly under 3x; torch's formula gave ~8x
    assert 2.8 * fwd < total <= 3.0 * fwd
