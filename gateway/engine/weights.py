"""Reading new weights from disk and checking they fit the served model before any swap."""

from __future__ import annotations

from pathlib import Path

import torch

from envhub.gateway.errors import BadRequest


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """Tensors from one `.safetensors` file, or from every `*.safetensors` in an HF folder."""
    p = Path(path)
    if p.is_file() and p.suffix == ".safetensors":
        files = [p]
    elif p.is_dir():
        files = sorted(p.glob("*.safetensors"))
        if not files:
            raise BadRequest(f"no *.safetensors file in {path}: save the checkpoint with "
                             "save_pretrained(..., safe_serialization=True)", param="model_path")
    else:
        raise BadRequest(f"{path} is neither a .safetensors file nor a folder; give the path "
                         "of a checkpoint readable by this engine", param="model_path")
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            tensors.update(load_file(str(f)))
        except Exception as exc:  # safetensors raises several types for a corrupt file
            raise BadRequest(f"cannot read {f}: {exc}", param="model_path") from exc
    return tensors


def check_weights(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Every tensor must name a parameter of `model` with the same shape, and every parameter
    must be covered (directly, or through a tied parameter sharing its storage)."""
    state = model.state_dict()
    unknown = sorted(set(tensors) - set(state))
    if unknown:
        raise BadRequest(f"{len(unknown)} tensors are not in the served model (e.g. "
                         f"{unknown[:3]}): the checkpoint is for another architecture",
                         param="model_path")
    wrong = [f"{k}: {tuple(t.shape)} vs {tuple(state[k].shape)}" for k, t in tensors.items()
             if t.shape != state[k].shape]
    if wrong:
        raise BadRequest(f"shape mismatch (checkpoint vs served model): {wrong[:3]}",
                         param="model_path")
    covered = {state[k].data_ptr() for k in tensors}
    missing = [k for k, t in state.items() if k not in tensors and t.data_ptr() not in covered]
    if missing:
        raise BadRequest(f"checkpoint lacks {len(missing)} tensors of the served model (e.g. "
                         f"{missing[:3]}); a partial update would mix weight versions",
                         param="model_path")


@torch.no_grad()
def apply_weights(tensors: dict[str, torch.Tensor], model: torch.nn.Module) -> None:
    """Copy in place (keeps the model's dtype and device; tied tensors are written once)."""
    state = model.state_dict()
    for name, tensor in tensors.items():
        state[name].copy_(tensor)
