"""Sharded checkpoints with torch.distributed.checkpoint (DCP) and exact resume (issue 13).

Layout of a checkpoint folder:
  .metadata, __*_*.distcp          DCP: model + optimizer state (`get_state_dict`), each rank
                                   writing its own shards (one process: the whole state)
  rng-rank{R}.safetensors          rank R's torch RNG states (CPU, and CUDA when present)
  trainer_state.json               version, step, consumed groups, config, world size, and
                                   what the caller adds (`envhub train`: its loop's state)
  other files                      copied in by the caller (`envhub train`: metrics.jsonl)

DCP reshards on load, so a checkpoint can resume on another world size; the RNG streams
then restart from rank 0's. The folder is written under a sibling temp name and renamed into
place by rank 0 once every rank has finished, so a crash never leaves a half-written
checkpoint under the final name.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.sdk import failpoints
from envhub.trainer.errors import TrainerError

if TYPE_CHECKING:
    import torch

    from envhub.trainer.distributed import DataParallel

STATE_FILE = "trainer_state.json"


def save_model_weights(model: Any, folder: Path) -> None:
    """transformers models: an HF folder (engines load it); plain modules: model.safetensors."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, safe_serialization=True)
    else:
        from safetensors.torch import save_model

        save_model(model, str(folder / "model.safetensors"))


@contextlib.contextmanager
def _one_process(dp: DataParallel | None) -> Iterator[None]:
    """DCP warns that it assumes one process when there is no process group: that is meant."""
    with warnings.catch_warnings():
        if dp is None:
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        yield


def _rng_state() -> dict[str, torch.Tensor]:
    import torch

    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor]) -> None:
    import torch

    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def write_checkpoint(folder: str | Path, model: Any, optimizer: torch.optim.Optimizer,
                     state: dict[str, Any], dp: DataParallel | None = None,
                     files: dict[str, Path] | None = None) -> Path:
    """Write a checkpoint folder (replacing an older one of the same name); collective under
    data parallelism. `files`: name -> path of files rank 0 copies into it (whole, before the
    folder takes its name)."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import get_state_dict

    rank = dp.rank if dp else 0
    final = Path(folder)
    tmp = final.with_name(f".{final.name}.tmp")
    if rank == 0:
        final.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    if dp:
        dp.barrier()
    try:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        with _one_process(dp):
            dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp),
                     no_dist=dp is None)
        save_file(_rng_state(), str(tmp / f"rng-rank{rank}.safetensors"))
        if rank == 0:
            world = dp.world if dp else 1
            (tmp / STATE_FILE).write_text(json.dumps({**state, "world_size": world}, indent=1))
            for name, src in (files or {}).items():
                shutil.copyfile(src, tmp / name)
        if dp:
            dp.barrier()
        failpoints.hit("checkpoint.write")  # everything written, nothing renamed yet
        if rank == 0:
            if final.exists():
                old = final.with_name(f".{final.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                final.rename(old)
                tmp.rename(final)
                shutil.rmtree(old)
            else:
                tmp.rename(final)
    finally:
        if rank == 0 and tmp.exists():
            shutil.rmtree(tmp)
    if dp:
        dp.barrier()
    return final


def read_checkpoint(folder: str | Path, model: Any, optimizer: torch.optim.Optimizer,
                    dp: DataParallel | None = None) -> dict[str, Any]:
    """Load weights, optimizer state and this rank's RNG state in place; return the trainer
    state dict. Collective under data parallelism."""
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = Path(folder)
    if not (path / STATE_FILE).is_file() or not (path / ".metadata").is_file():
        raise TrainerError(f"{path} is not a trainer checkpoint (no {STATE_FILE} or DCP "
                           ".metadata); pass a folder written by Trainer.save_checkpoint")
    state: dict[str, Any] = json.loads((path / STATE_FILE).read_text())
    model_sd, optim_sd = get_state_dict(model, optimizer)
    loaded: dict[str, Any] = {"model": model_sd, "optimizer": optim_sd}
    try:
        with _one_process(dp):
            dcp.load(loaded, checkpoint_id=str(path), no_dist=dp is None)
    except Exception as exc:  # DCP raises plain RuntimeErrors/KeyErrors on a mismatch
        raise TrainerError(f"checkpoint {path} does not match this model/optimizer ({exc}); "
                           "load it into the architecture (and LoRA setup) it was saved "
                           "from") from exc
    set_state_dict(model, optimizer, model_state_dict=loaded["model"],
                   optim_state_dict=loaded["optimizer"])
    rank = dp.rank if dp else 0
    rng = path / f"rng-rank{rank}.safetensors"
    _set_rng_state(load_file(str(rng if rng.is_file() else path / "rng-rank0.safetensors")))
    return state
