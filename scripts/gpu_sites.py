"""The transformer graph sites' device paths, for a lent GPU machine (scripts/gpu_check.sh's
`sites` step): on CPU these are tested against float64 (tests/test_fuse_mha.py,
test_fuse_attention.py, test_fuse_torch_transformer.py); on CUDA they take other code: the
mlp site's dropout is native_dropout, the mha site hands SDPA strided views (and SDPA picks
its CUDA kernel, and with it its dropout draws), the attention site's masks go to the
memory-efficient kernel.

    python scripts/gpu_sites.py [--device cuda] [--size tiny|bench]

Per model (tests/assets: torch.nn encoder layers with dropout 0.1, nn.Transformer seq2seq,
torchvision's ViT with attention dropout, the nanoGPT-like GPT, a Swin stage, a LLaMA in HF
transformers' current layout, Stable
Diffusion's einsum attention and lucidrains' ViT (einops), the written-out attention
spellings): eager and fused
copies (one seed) take one float32 step each from the same RNG state; the line gives the
sites, the largest output and gradient errors (each gradient scaled by the largest one), the
SDPA backward that ran, and ok / MISMATCH; then both under bf16 autocast against float32
eager: fused no more than twice eager's own error. Exit 1 when a
model fails either."""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

TOL = 1e-4                  # float32, fused against eager


def models(size: str) -> dict:
    from assets import (attention_spellings, convnext_v2, hf_llama, nano_gpt, swin,
                        torch_transformer, tv_vit)
    out = {
        "torch_encoder_dropout": lambda: torch_transformer.make(size=size, dropout=0.1,
                                                                norm_first=True,
                                                                activation="gelu"),
        "torch_seq2seq_dropout": lambda: torch_transformer.make_seq2seq(size=size, dropout=0.1),
        "tv_vit_dropout": lambda: tv_vit.make(size=size, dropout=0.1, attention_dropout=0.1),
        "nano_gpt": lambda: nano_gpt.make(size=size),
        "swin_stage": swin.SwinStage,       # learned bias + windowed mask: CUDA takes its grad
        # HF's current layout: grouped k/v heads; under autocast q, k float32 and v bf16
        "hf_llama": lambda: hf_llama.make(size),
        # fc1 -> GELU -> GRN -> fc2 (grn_mlp): the grn family bound for CUDA (Triton)
        "convnext_v2": convnext_v2.make_trained,
    }
    try:                    # a test extra: the device image may lack it (gpu_wheels.sh carries it)
        from assets import einops_models
    except ImportError as e:
        print(f"sd_spatial_transformer, lucidrains_vit: not checked ({e})")
    else:
        out["sd_spatial_transformer"] = lambda: einops_models.make_sd(size)   # (b h) heads
        out["lucidrains_vit"] = lambda: einops_models.make_vit(size)
    for name, cls in attention_spellings.SPELLINGS.items():
        out[f"attention_{name}"] = cls
    return out


def _inputs(model, device):
    if hasattr(model, "example_inputs"):
        return model.example_inputs(2, device, torch.float32)
    if hasattr(model, "input_size"):                 # an image model (ConvNeXt V2)
        return (torch.randn(2, *model.input_size, device=device),)
    from assets import attention_spellings
    return (torch.randn(2, attention_spellings.T, attention_spellings.DIM, device=device),)


def _step(model, inputs, amp: bool):
    torch.manual_seed(7)
    with torch.autocast(inputs[0].device.type, torch.bfloat16, enabled=amp):
        y = model(*inputs)
    y.float().square().mean().backward()
    return y.float(), {n: p.grad.float() for n, p in model.named_parameters()
                       if p.grad is not None}


def _sdpa_nodes(y) -> set[str]:
    from tests.helpers import autograd_nodes
    return {type(n).__name__.removesuffix("Backward0") for n in autograd_nodes(y)
            if "ScaledDotProduct" in type(n).__name__}


def _errs(step, ref) -> tuple[float, float, str]:
    from fusebench.measure.correctness import grad_errs, rel_err
    y, grads = step
    g = grad_errs(grads, ref[1], list(ref[1]), floor=1e-3)
    worst = max(g, key=g.get)
    return rel_err(y, ref[0], 1e-3 * ref[0].abs().max().item()), g[worst], worst


def check(name, factory, device: str) -> bool:
    """float32: fused against eager within TOL. bf16 autocast: fused's error against float32
    eager no more than twice eager's own under the same autocast (a gradient that is ~0 in
    exact arithmetic, the keys' bias under softmax, is all rounding in bf16)."""
    from fusebench.fuse import fuse
    torch.manual_seed(0)
    eager = factory().to(device).train()
    fused = copy.deepcopy(eager)
    sites = dict(fuse(fused, "train", device=device).sites)
    inputs = _inputs(eager, device)
    ref = _step(eager, inputs, False)
    y, grads = _step(fused, inputs, False)
    out, grad, where = _errs((y, grads), ref)
    ok = out < TOL and grad < TOL
    print(f"{name:30s} float32 sites {sites}: out {out:.1e}, grad {grad:.1e} ({where}); SDPA "
          f"{sorted(_sdpa_nodes(y)) or '-'}: {'ok' if ok else 'MISMATCH'}", flush=True)
    errs = {}
    for side, m in (("eager", eager), ("fused", fused)):
        m.zero_grad(set_to_none=True)
        errs[side] = _errs(_step(m, inputs, True), ref)
    bf_ok = all(f <= 2 * e + 1e-6 for f, e in zip(errs["fused"][:2], errs["eager"][:2]))
    print(f"{name:30s} bf16    out {errs['fused'][0]:.1e} (eager's {errs['eager'][0]:.1e}), "
          f"grad {errs['fused'][1]:.1e} (eager's {errs['eager'][1]:.1e}): "
          f"{'ok' if bf_ok else 'WORSE THAN EAGER'}", flush=True)
    return ok and bf_ok


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--size", default="tiny", choices=("tiny", "bench"))
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: nothing checked")
        return 2
    results = [check(name, f, args.device) for name, f in models(args.size).items()]
    print(f"{sum(results)} of {len(results)} models ok")
    return 0 if all(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
