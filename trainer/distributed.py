"""Data parallelism with torch.distributed (issue 7, item 6).

Every rank builds the same `Batch` (filters and advantages are cheap and deterministic), then
trains on its shard of the groups. The loss is divided by the *global* number of loss tokens
and gradients are summed across ranks, so W ranks produce exactly the update one process
would make on the whole batch. Backends: gloo on CPU (tests), NCCL on GPUs. With
`fsdp=True` (GPUs) the model is sharded with FSDP2 `fully_shard`, which averages gradients
over ranks; the trainer then scales its loss by the world size to keep sum semantics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class DataParallel:
    """Rank/world info and the few collectives the trainer needs."""

    def __init__(self, fsdp: bool = False) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call "
                               "DataParallel.init(backend) (or torchrun + init) first")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.fsdp = fsdp

    @staticmethod
    def init(backend: str | None = None, **kwargs: Any) -> DataParallel:
        """Initialise the default process group from the env (torchrun) or kwargs."""
        import torch
        import torch.distributed as dist

        if not dist.is_initialized():
            backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
            dist.init_process_group(backend=backend, **kwargs)
        return DataParallel()

    def shard(self, sizes: list[int]) -> list[int]:
        """Indices of the items (e.g. groups, weighted by token count) this rank trains on.

        Longest-first onto the least-loaded rank: deterministic, so every rank computes the
        same assignment without talking.
        """
        load = [0] * self.world
        owner = [0] * len(sizes)
        for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
            r = min(range(self.world), key=lambda r: (load[r], r))
            owner[i] = r
            load[r] += sizes[i]
        return [i for i, r in enumerate(owner) if r == self.rank]

    def sum_floats(self, values: list[float]) -> list[float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor(values, dtype=torch.float64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def min_max(self, lo: float, hi: float) -> tuple[float, float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor([-lo, hi], dtype=torch.float64, device=self._device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return -float(t[0]), float(t[1])

    def sum_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """All-reduce (sum) gradients through one flat buffer; a missing grad counts as 0."""
        import torch
        import torch.distributed as dist

        if self.fsdp:
            return  # FSDP already reduced them during backward
        grads: list[torch.Tensor] = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n

    def loss_scale(self) -> float:
        """Factor on the loss so that reduced gradients are sums over ranks."""
        return float(self.world) if self.fsdp else 1.0

    def _device(self) -> torch.device:
        import torch
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")


def wrap_fsdp(model: Any) -> Any:
    """Shard a transformers model with FSDP2 (one unit per decoder layer, then the root)."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", model), "layers", [])
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)
    return model
