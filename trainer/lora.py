"""LoRA through PEFT: adapters on the policy, merged full weights for the engines.

`apply_lora` wraps a transformers causal LM in a `PeftModel` (base weights frozen, only the
adapters require gradients). Engines load full HF folders, so a push merges: `MergeShell`
keeps a weightless (meta-device) copy of the PEFT model; each push loads the trainer's full
state (copied) into a fresh copy of it (`assign=True`) and writes PEFT's
`merge_and_unload()` of it — the trained model itself is never merged and unmerged, so no
rounding drift accumulates in its base weights.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.trainer.config import LoraSettings
from envhub.trainer.errors import TrainerError

if TYPE_CHECKING:
    import torch


def is_peft(model: Any) -> bool:
    return callable(getattr(model, "get_base_model", None)) and hasattr(model, "peft_config")


def apply_lora(model: Any, settings: LoraSettings) -> Any:
    """`model` with LoRA adapters (PEFT `get_peft_model`); a PEFT model is returned as is."""
    if is_peft(model):
        return model
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:
        raise TrainerError("LoRA needs the `peft` package: pip install 'envhub[train]'") from exc
    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha,
                        target_modules=settings.targets, lora_dropout=settings.dropout,
                        bias="none", task_type="CAUSAL_LM")
    try:
        return get_peft_model(model, config)
    except ValueError as exc:  # e.g. target modules not found in the model
        raise TrainerError(f"cannot add LoRA adapters: {exc}; fix lora.targets") from exc


class MergeShell:
    """A meta-device copy of a PEFT model, to write merged weights from a full state dict."""

    def __init__(self, model: Any) -> None:
        self.shell = copy.deepcopy(model).to("meta")

    def save_merged(self, state: dict[str, torch.Tensor], folder: Path) -> None:
        model = copy.deepcopy(self.shell)
        # copies: in one process on CPU the state dict shares the trained tensors, which
        # the in-place merge would otherwise change
        own = {k: v.detach().clone() for k, v in state.items()}
        missing, unexpected = model.load_state_dict(own, strict=False, assign=True)
        if missing or unexpected:
            raise TrainerError(f"full state does not match the LoRA model: missing "
                               f"{missing[:5]}, unexpected {unexpected[:5]}")
        if getattr(model.config, "tie_word_embeddings", False):
            model.get_base_model().tie_weights()  # `assign` loaded the two names apart
        merged = model.merge_and_unload()
        merged.save_pretrained(folder, safe_serialization=True)
