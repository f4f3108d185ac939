"""Shared test helpers: paths of the asset models and plugin modes, a tiny cell spec, the
autograd graph walk. Imported as `from tests.helpers import ...`; fixtures are in conftest.py."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ASSETS = Path(__file__).resolve().parent / "assets"
TINY = f"{ASSETS / 'tiny_models.py'}:tiny_cnn"
GRAPH_BREAK = f"{ASSETS / 'tiny_models.py'}:graph_break_cnn"
WARNING = f"{ASSETS / 'tiny_models.py'}:warning_cnn"
RAISING = f"{ASSETS / 'tiny_models.py'}:raising_factory"
SPAWNING = f"{ASSETS / 'tiny_models.py'}:spawning_cnn"
BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
FAULT_PLUGIN = str(ASSETS / "fault_modes.py")
ALL_FAULT_PLUGINS = f"{FAULT_PLUGIN},{ASSETS / 'more_faults.py'}"   # + tests/assets/more_faults.py


def tiny_spec(**kw):
    from fusebench.spec import CellSpec
    base = dict(model=TINY, mode="eager", batch_size=4, warmup=1, steps=3, device="cpu",
                timeout=120.0, threads=1)   # tiny shapes: one thread is fastest
    base.update(kw)
    return CellSpec.for_model(base.pop("model"), base.pop("mode"), **base)



def autograd_nodes(y):
    """Every autograd node behind tensor y, once (which kernels a step really ran)."""
    seen, stack = set(), [y.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(n for n, _ in node.next_functions)


def assert_matches_eager(model, ref, inputs, tol=1e-9, call=None):
    """One forward + backward of model (through `call`, e.g. a mode's prepared callable, when
    given) and its eager reference on the same inputs: outputs and every parameter's gradient
    agree within tol. Returns the model's output (its first tensor, as the cells' loss takes
    it: a torchaudio-style `(output, lengths)`)."""
    import torch

    from fusebench.cell.model_step import first_tensor
    from fusebench.measure import correctness as corr
    y, r = first_tensor((call or model)(*inputs)), first_tensor(ref(*inputs))
    torch.testing.assert_close(y, r, atol=tol, rtol=tol)
    y.square().mean().backward()
    r.square().mean().backward()
    got = {n: p.grad for n, p in model.named_parameters()}
    exp = {n: p.grad for n, p in ref.named_parameters()}
    assert max(corr.grad_errs(got, exp, list(exp), floor=1e-3).values()) < tol
    return y


def assert_close_to_float64(model, ref, inputs, atol, rtol, grad_tol, ref_inputs=None):
    """One forward + backward of a float32 model and its float64 reference (on `ref_inputs`,
    default the same inputs): output within atol / rtol, every parameter's gradient within
    grad_tol (relative, corr.grad_errs). Returns the model's output."""
    import torch

    from fusebench.measure import correctness as corr
    y, r = model(*inputs), ref(*(inputs if ref_inputs is None else ref_inputs))
    torch.testing.assert_close(y.double(), r, atol=atol, rtol=rtol)
    y.square().mean().backward()
    r.square().mean().backward()
    got = {n: p.grad.double() for n, p in model.named_parameters()}
    exp = {n: p.grad for n, p in ref.named_parameters()}
    assert max(corr.grad_errs(got, exp, list(exp), floor=1e-3).values()) < grad_tol
    return y


def moved(model, scale: float = 0.05, seed: int = 2):
    """model with every parameter moved by scale x N(0, 1) (seeded): layer scales at 1e-6 would
    hide what they scale from a comparison."""
    import torch
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(scale * torch.randn_like(p))
    return model


def channels_last_image(size: int = 64, batch: int = 2, seed: int = 1):
    """A float64 RGB batch, channels-last (cast it for a float32 model)."""
    import torch
    return torch.randn(batch, 3, size, size, dtype=torch.float64,
                       generator=torch.Generator().manual_seed(seed)) \
        .contiguous(memory_format=torch.channels_last)


def random_running_stats(model, freeze: bool = False):
    """Every BatchNorm2d's running statistics set to values far from init (mean in
    [-0.5, 0.5], var in [0.5, 1.5]); freeze: those BNs in eval mode (frozen statistics inside
    a training run, as a fine-tuned backbone has). Returns model."""
    import torch
    import torch.nn as nn
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                if freeze:
                    m.eval()
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 1.5)
    return model


def load_benchmark(name: str):
    """benchmarks/<name>.py imported as the module `<name>_bench` (benchmarks are scripts, not a
    package; registered in sys.modules because dataclasses look their module up there)."""
    return _load(f"{name}_bench", BENCHMARKS / f"{name}.py")


def load_script(name: str):
    """scripts/<name>.py imported as the module `<name>`, as load_benchmark does."""
    return _load(name, BENCHMARKS.parent / "scripts" / f"{name}.py")


def _load(module: str, path: Path):
    spec = importlib.util.spec_from_file_location(module, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def interpreted_triton() -> None:
    """Skip unless Triton can run our kernels interpreted on CPU tensors here: installed, and
    an interpreter not among those measured to fail them (kernels/triton_support.py)."""
    import pytest
    pytest.importorskip("triton")
    from fusebench.kernels.triton_support import interpreter_reason
    if interpreter_reason():
        pytest.skip(interpreter_reason())
