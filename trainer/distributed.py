"""Data parallelism: FSDP2 (`fully_shard`) under torchrun (issue 13).

Every rank builds the same `Batch` (filters and advantages are cheap and deterministic), then
trains on its shard of the groups. The model is sharded with FSDP2: one unit per decoder
layer plus the causal LM as root (embeddings, final norm and LM head, tied or not). FSDP2
all-gathers parameters around each unit's forward/backward and reduce-scatters *averaged*
gradients; the trainer divides its loss by the *global* number of loss tokens and scales it
by the world size, so W ranks make exactly the update one process makes on the whole batch.

Launch with torchrun (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT):
`DataParallel.init()` joins the process group (NCCL on GPUs, one device per local rank; gloo
on CPU). Only metrics are reduced here (`sum_floats`, `min_max`, float64); gradients,
sharded checkpoints (checkpoint.py, DCP) and the full-state gather for the weight push
(weights.py) are FSDP2's and DCP's.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

# The method FSDP2 treats as a forward of the root (see `shard_model`, forward.py).
TREE_FORWARD = "envhub_tree_forward"


def default_device(local_rank: int | None = None) -> torch.device:
    """CUDA device `local_rank` (LOCAL_RANK from torchrun, else 0) when CUDA is present, CPU
    otherwise."""
    import torch

    if torch.cuda.is_available():
        if local_rank is None:
            local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def choose_device(name: str | None, dp: DataParallel | None = None) -> torch.device:
    """The device `TrainerConfig.device` names, checked against this machine (a ValueError
    with the fix when it lacks it). None or `auto`: this rank's device (`dp`), else
    `default_device()`. `cpu` never asks about CUDA, so no CUDA context is created."""
    from envhub.sdk.device import check_device, resolve_device

    device = "auto" if name is None else check_device(name)
    if device == "auto":
        return dp.device if dp is not None else default_device()
    if dp is not None and dp.world > 1 and device.startswith("cuda"):
        # each rank trains on its own GPU (cuda:LOCAL_RANK, which NCCL was given)
        if device != "cuda":
            raise ValueError(f"device {name!r} under {dp.world} ranks would put every rank on "
                             "one GPU: use --device cuda (or auto), each rank takes its own")
        return dp.device
    return resolve_device(device)


class DataParallel:
    """Rank/world info, the device of this rank and the metric collectives."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: launch with torchrun and "
                               "call DataParallel.init() (or dist.init_process_group) first")
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.device = default_device() if dist.get_backend() == "nccl" else _cpu()

    @staticmethod
    def init(backend: str | None = None, device: str | None = None,
             **kwargs: Any) -> DataParallel:
        """Join the default process group from torchrun's environment (or `kwargs`): NCCL
        with this rank's GPU when CUDA is present, gloo on CPU or when `device` (the
        trainer's, `TrainerConfig.device`) names one that is not CUDA."""
        import torch
        import torch.distributed as dist

        from envhub.sdk.device import check_device

        if not dist.is_initialized():
            gpu = check_device(device or "auto").startswith(("auto", "cuda"))
            backend = backend or ("nccl" if gpu and torch.cuda.is_available() else "gloo")
            if backend == "nccl":
                torch.cuda.set_device(default_device())
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

        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def min_max(self, lo: float, hi: float) -> tuple[float, float]:
        import torch
        import torch.distributed as dist

        t = torch.tensor([-lo, hi], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return -float(t[0]), float(t[1])

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier()

    def loss_scale(self) -> float:
        """Factor on the loss: FSDP2 averages gradients over ranks, the trainer wants sums."""
        return float(self.world)


def run_rank(main: Callable[[], Any]) -> NoReturn:
    """Run a torchrun rank's `main` and end the process with its exit status (0, the code of
    a `SystemExit`, 1 with the traceback for any other exception) *without* the interpreter's
    final teardown: threads are joined and `atexit` handlers (logging, temporary folders,
    Ray) run, then `os._exit`.

    Why: `destroy_process_group` does not end gloo's worker threads (FSDP2's device meshes
    keep the process group alive), and a worker that drops the last reference to a
    Python-created tensor (e.g. `broadcast_object_list`'s) after the interpreter began
    finalising tries to take the GIL, is ended by CPython mid-destructor, and the process
    aborts ("terminate called without an active exception", SIGABRT) though every rank
    finished: torchrun then reports the run failed. Seen here in about 1 in 4 two-rank runs
    under load; pytorch/pytorch#190489 (open) has the same backtrace."""
    code: int = 0
    try:
        main()
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: BLE001 (reported as the interpreter would, then exit 1)
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _cpu() -> torch.device:
    import torch

    return torch.device("cpu")


def causal_lm(model: Any) -> Any:
    """The transformers causal LM inside `model` (a PEFT model's base model, else itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def _checkpointing_name(model: Any) -> str:
    """transformers after 5.17 renamed gradient checkpointing `activation_checkpointing` (the old
    names warn there); 5.17, which CUDA images ship, has only the old ones."""
    return "activation_checkpointing" if hasattr(model, "activation_checkpointing_enable") \
        else "gradient_checkpointing"


def set_activation_checkpointing(model: Any, on: bool) -> None:
    """Recompute each decoder layer's activations in the backward (non-reentrant) or stop."""
    name = _checkpointing_name(model)
    if on:
        getattr(model, f"{name}_enable")({"use_reentrant": False})
    else:
        getattr(model, f"{name}_disable")()


def activation_checkpointing(model: Any) -> bool:
    """Whether `model` recomputes its layers' activations in the backward."""
    return bool(getattr(model, f"is_{_checkpointing_name(model)}"))


def shard_model(model: Any, param_dtype: torch.dtype | None = None) -> Any:
    """Shard a transformers causal LM (or a PEFT model around one) with FSDP2, in place.

    One unit per decoder layer, then the causal LM itself as root, so the embeddings, final
    norm and a tied LM head share one unit. `param_dtype` (e.g. bfloat16) is FSDP2's
    mixed precision: compute in it, parameters (master weights) and gradient reduction in
    fp32. The tree forward (forward.py) calls the decoder and the LM head separately; it is
    registered as a forward method of the root, so FSDP2's root hooks gather and reshard
    around it like around `forward`.
    """
    import torch
    from torch.distributed.fsdp import (
        MixedPrecisionPolicy,
        fully_shard,
        register_fsdp_forward_method,
    )

    from envhub.trainer.forward import bind_tree_forward

    lm = causal_lm(model)
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    for layer in getattr(getattr(lm, "model", lm), "layers", []):
        fully_shard(layer, mp_policy=mp)
    fully_shard(lm, mp_policy=mp)
    bind_tree_forward(lm)
    register_fsdp_forward_method(lm, TREE_FORWARD)
    return model
