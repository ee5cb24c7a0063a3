"""Checkpoints with resume (issue 7, item 6), all tensors in safetensors.

Layout of a checkpoint folder:
  model.safetensors (+ config.json for transformers models)   weights
  optimizer.safetensors                                         AdamW moments, `state.{i}.{name}`
  trainer_state.json                                            version, step, consumed groups,
                                                                optimizer scalars, config
A checkpoint is written into a sibling temp folder and renamed into place, so a crash never
leaves a half-written checkpoint under the final name.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.trainer.errors import TrainerError

if TYPE_CHECKING:
    import torch

STATE_FILE = "trainer_state.json"


def save_model_weights(model: Any, folder: Path) -> None:
    """transformers models: an HF folder (engines load it); plain modules: model.safetensors."""
    if hasattr(model, "save_pretrained"):
        model.save_pretrained(folder, safe_serialization=True)
    else:
        from safetensors.torch import save_model

        save_model(model, str(folder / "model.safetensors"))


def load_model_weights(model: Any, folder: Path) -> None:
    from safetensors.torch import load_file

    files = sorted(folder.glob("*.safetensors"))
    files = [f for f in files if f.name != "optimizer.safetensors"]
    if not files:
        raise TrainerError(f"{folder} has no model *.safetensors; pass a folder written by "
                           "Trainer.save_checkpoint")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied weights (lm_head = embed_tokens) are saved once; anything else missing is an error.
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise TrainerError(f"checkpoint {folder} does not match the model: missing "
                           f"{missing[:5]}, unexpected {unexpected[:5]}; load it into the "
                           "same architecture it was saved from")


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor],
                                                                    dict[str, Any]]:
    """Split optimizer state into tensors (safetensors) and JSON scalars."""
    import torch

    sd = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {"param_groups": sd["param_groups"], "state": {}}
    for idx, st in sd["state"].items():
        for name, value in st.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{idx}.{name}"] = value.detach().cpu().contiguous()
            else:
                scalars["state"].setdefault(str(idx), {})[name] = value
    return tensors, scalars


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                      scalars: dict[str, Any]) -> None:
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for idx, extra in scalars.get("state", {}).items():
        state.setdefault(int(idx), {}).update(extra)
    optimizer.load_state_dict({"state": state, "param_groups": scalars["param_groups"]})


def write_checkpoint(folder: str | Path, model: Any, optimizer: torch.optim.Optimizer,
                     state: dict[str, Any]) -> Path:
    """Atomically write a checkpoint folder (replacing an older one of the same name)."""
    from safetensors.torch import save_file

    final = Path(folder)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        save_model_weights(model, tmp)
        tensors, scalars = optimizer_tensors(optimizer)
        save_file(tensors, str(tmp / "optimizer.safetensors"))
        (tmp / STATE_FILE).write_text(json.dumps({**state, "optimizer": scalars}, indent=1))
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old)
        else:
            tmp.rename(final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return final


def read_checkpoint(folder: str | Path, model: Any, optimizer: torch.optim.Optimizer
                    ) -> dict[str, Any]:
    """Load weights and optimizer state in place; return the trainer state dict."""
    from safetensors.torch import load_file

    path = Path(folder)
    if not (path / STATE_FILE).is_file():
        raise TrainerError(f"{path} is not a trainer checkpoint (no {STATE_FILE}); pass a "
                           "folder written by Trainer.save_checkpoint")
    state = json.loads((path / STATE_FILE).read_text())
    load_model_weights(model, path)
    restore_optimizer(optimizer, load_file(str(path / "optimizer.safetensors")),
                      state.pop("optimizer"))
    return state
