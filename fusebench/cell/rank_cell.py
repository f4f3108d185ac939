"""One rank of a distributed cell: `torchrun ... -m fusebench.cell.rank_cell SPEC OUT`.

Process group (gloo on CPU, nccl on CUDA with the LOCAL_RANK device) -> the ordinary model cell,
which calls `RankRun.wrap` after the build. Every rank builds the same model from the same seed and
feeds the same input, so data-parallel averaged gradients equal the single-process reference
gradients: the correctness check of every mode still holds. The coordinator side (launch, collect,
aggregate) is run/distributed.py.
"""
from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from fusebench.protocol import RANK_MODULE, WORKER_MODULE, rank_path
from fusebench.spec import CellSpec, DistPart

@dataclass(frozen=True)
class RankEnv:
    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def from_env(cls) -> "RankEnv":
        return cls(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
                   int(os.environ["WORLD_SIZE"]))


def init_process_group(device_type: str, env: RankEnv) -> str:
    """gloo on CPU, nccl on CUDA (one device per local rank). Returns the rank's device."""
    import torch
    import torch.distributed as dist
    if device_type == "cuda":
        torch.cuda.set_device(env.local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", env.local_rank))
        return f"cuda:{env.local_rank}"
    dist.init_process_group("gloo")
    return "cpu"


class RankRun:
    """The model cell's view of the distributed run: wrap after build, gather full gradients and
    state for the correctness check. Everything here is collective: every rank calls it."""

    def __init__(self, settings: DistPart):
        self.settings = settings
        self.strategy = settings.strategy
        self.wrapped = None
        self.inner = None

    @classmethod
    def from_spec(cls, spec: CellSpec) -> "RankRun | None":
        import torch.distributed as dist
        d = spec.dist
        if d is None:
            return None
        if not dist.is_initialized():
            raise RuntimeError(f"a distributed cell must run under torchrun (python -m "
                               f"{RANK_MODULE}), not python -m {WORKER_MODULE}")
        return cls(d)

    def wrap(self, mode, model, example_inputs, options, events):
        """Rewrite (modes that swap submodules must do it before the wrapper records the
        parameters) then wrap. Returns the module to hand to mode.prepare."""
        import torch
        rewrite = getattr(mode, "rewrite", None)
        if rewrite is not None:
            model = rewrite(model, example_inputs, options, events)
        device = next(model.parameters()).device
        self.inner = model
        if self.strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        elif self.strategy == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            # device_id: FSDP1 refuses CPU modules unless told the device explicitly
            self.wrapped = FSDP(model, use_orig_params=True,
                                device_id=device if device.type == "cuda" else torch.device("cpu"))
        else:
            from torch.distributed.fsdp import fully_shard
            self.wrapped = fully_shard(model)
        events.add("info", "distributed",
                   f"{self.strategy} over {torch.distributed.get_world_size()} ranks "
                   f"({torch.distributed.get_backend()})")
        return self.wrapped

    def full_grads(self, model) -> dict:
        """Unsharded parameter gradients by the unwrapped model's parameter names."""
        if self.strategy == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            with FSDP.summon_full_params(self.wrapped, with_grads=True):
                return {n: (p.grad.detach().clone() if p.grad is not None else None)
                        for n, p in model.named_parameters() if p.requires_grad}
        return {n: (_full(p.grad).detach().clone() if p.grad is not None else None)
                for n, p in model.named_parameters() if p.requires_grad}

    def full_state_dict(self, model) -> dict:
        """Unsharded state dict with the unwrapped model's names (the reference loads it)."""
        if self.strategy == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp import StateDictType
            with FSDP.state_dict_type(self.wrapped, StateDictType.FULL_STATE_DICT):
                state = self.wrapped.state_dict()
        else:
            state = model.state_dict()
        return {k: _full(v).detach().clone() for k, v in state.items()}


def _full(t):
    """A DTensor (FSDP2) gathered to a plain tensor; anything else as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _summary(rec: dict, rank: int) -> dict:
    return {"rank": rank, "batch_size": rec["spec"]["model"]["batch_size"],
            "median_ms": (rec.get("step_ms") or {}).get("median"),
            "peak_mem_bytes": rec.get("peak_mem_bytes"), "host": socket.gethostname()}


def main(argv: list[str]) -> int:
    """One rank: `torchrun ... -m fusebench.cell.rank_cell SPEC OUT`. Writes OUT.rankR.json."""
    from fusebench.cell import worker
    from fusebench.results.document import write_atomic

    spec_path, out_path = Path(argv[1]), Path(argv[2])
    env = RankEnv.from_env()
    write_atomic(rank_path(out_path, env.rank, ".pid"), str(os.getpid()))
    spec_dict = json.loads(spec_path.read_text())
    device = init_process_group(spec_dict.get("device", "cpu").split(":")[0], env)
    record = worker.run({**spec_dict, "device": device})
    record["spec"]["device"] = spec_dict.get("device", device)   # the aggregate names the device type
    record["extra"]["rank"] = env.rank
    path = rank_path(out_path, env.rank)
    write_atomic(path, json.dumps(record, allow_nan=False))
    code = 0
    if record["status"] == "ok":
        # every rank got here: share per-rank figures so each node's record is global
        import torch.distributed as dist
        gathered: list = [None] * env.world_size
        dist.all_gather_object(gathered, _summary(record, env.rank))
        record["extra"]["dist_ranks"] = gathered
        write_atomic(path, json.dumps(record, allow_nan=False))
        dist.destroy_process_group()
    else:
        code = 1   # torchrun then stops the other ranks, which may wait in a collective
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)   # as the worker: skip teardown once the record is safe on disk


if __name__ == "__main__":
    sys.exit(main(sys.argv))
