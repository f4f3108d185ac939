"""Branches on a Parameter's dtype or device, decided at trace time and guarded at call time.

T5's LayerNorm (and the RMSNorms HF copied from it) reads
`if self.weight.dtype in [torch.float16, torch.bfloat16]: x = x.to(self.weight.dtype)`;
`if self.proj.weight.device.type == "cpu":` is the same shape. fx traces `self.weight` as a
graph value, so the `if` asks a Proxy for its truth value and the trace failed: the norm ran
unfused. A Parameter's dtype and device are not data: they change only by `.to()`/`.half()`.
So a truth value computed from them alone (through ==, !=, in, not, `.type`) is taken from the
real tensors while tracing, and the (dtype, device) of each tensor it read is kept with the
graph; a call that finds any of them changed runs the module's own forward (trace.install),
with a warning once per class. A truth value that reads a tensor's values, or an input's dtype,
still fails the trace as before."""
from __future__ import annotations

import operator
import warnings

import torch
import torch.fx as fx

READS = "fusebench_static_reads"   # graph attribute: {target: (dtype, device)} read at trace
META = ("dtype", "device")           # what may be read of a Parameter or buffer
# pure functions of such values; `contains` is what `x in [a, b]` asks each item (via eq)
PURE = {operator.eq, operator.ne, operator.not_, operator.is_, operator.is_not,
        operator.contains, operator.truth}


class NotStatic(Exception):
    pass


def value(node, root: torch.nn.Module, reads: dict) -> object:
    """node's value computed from Parameters' / buffers' dtype and device only (recording in
    `reads` what it read), else NotStatic."""
    if not isinstance(node, fx.Node):
        if isinstance(node, (list, tuple)):
            return type(node)(value(a, root, reads) for a in node)
        if isinstance(node, torch.Tensor):
            raise NotStatic
        return node
    if node.op == "call_function" and node.target is getattr:
        base, name = node.args
        if isinstance(base, fx.Node) and base.op == "get_attr":
            if name not in META:
                raise NotStatic
            tensor = _tensor(root, base.target)
            reads[base.target] = (tensor.dtype, tensor.device)
            return getattr(tensor, name)
        got = value(base, root, reads)
        if isinstance(got, torch.device) and name in ("type", "index"):
            return getattr(got, name)
        raise NotStatic
    if node.op == "call_function" and node.target in PURE:
        return node.target(*(value(a, root, reads) for a in node.args))
    raise NotStatic


def _tensor(root: torch.nn.Module, target: str) -> torch.Tensor:
    path, _, name = target.rpartition(".")
    owner = root.get_submodule(path) if path else root
    # not getattr: while tracing, fx's Module.__getattr__ answers a Proxy
    tensor = owner._parameters.get(name, owner._buffers.get(name, vars(owner).get(name)))
    if not isinstance(tensor, torch.Tensor):
        raise NotStatic
    return tensor


def truth(node: fx.Node, root: torch.nn.Module, reads: dict) -> bool | None:
    """The truth value of node where it is static (reads recorded), else None."""
    found: dict = {}
    try:
        out = bool(value(node, root, found))
    except NotStatic:
        return None
    reads.update(found)
    return out


def changed(module: torch.nn.Module, reads: dict) -> str | None:
    """The first tensor read at trace time whose dtype or device differs now, as words."""
    for target, (dtype, device) in reads.items():
        try:
            now = _tensor(module, target)
        except (NotStatic, AttributeError):   # not where it was (a wrapper's views): the
            continue                          # graph's own read of it decides
        if (now.dtype, now.device) != (dtype, device):
            return (f"{target} is {now.dtype} on {now.device}, traced as {dtype} on {device}")
    return None


_warned: set[str] = set()


def warn_once(cls: str, why: str) -> None:
    if cls not in _warned:
        _warned.add(cls)
        warnings.warn(f"fused {cls}: its graph decided a branch on a parameter's dtype or "
                      f"device, and {why}: running its own forward (not fused)", stacklevel=3)
