"""Activation kernels for the zoo, three families in one package: memory-efficient SiLU
("silu"), SE gate ("se_gate"), bias + GELU ("bias_gelu"). One module per family (its plain-torch
impls and its kernel problem); cpu.py / triton.py hold the native impls of all three, because
one C++ extension (one build, one cache entry) and one Triton module serve them together.

Stable API for the fuser (each: pure fwd/bwd functions -> autograd.Function -> functional ->
nn.Module; the module's `impl` picks a registered impl, default "function" = plain torch):
    silu_me(x)                      SiLUMemEff(inplace=False, impl="function")
    se_gate(x, gate_logits)         SEGate(impl="function")          forward(x, gate_logits)
    bias_gelu(x, bias, approximate) BiasGELU(bias_param, approximate="none", impl="function")
Impls: eager, function, cpu, triton; silu also naive."""
from fusebench.kernels.act.bias_gelu import BiasGELU, BiasGELUFunction, bias_gelu
from fusebench.kernels.act.se_gate import SEGate, SEGateFunction, se_gate
from fusebench.kernels.act.silu import SiLUFunction, SiLUMemEff, silu_me
from fusebench.kernels.act import cpu, triton  # noqa: F401,E402  (register the bundled kernels)

__all__ = ["BiasGELU", "BiasGELUFunction", "SEGate", "SEGateFunction", "SiLUFunction",
           "SiLUMemEff", "bias_gelu", "se_gate", "silu_me"]
