"""Weight sync to the inference engines (issue 7, item 6).

The trainer writes the new weights as an HF folder (config.json + model.safetensors) named by
version and hands the path to a `push(path)` callback. `http_pusher(url)` builds such a
callback that POSTs `{"model_path": path, "weight_version": "<v>"}`: the body SGLang's
`/update_weights_from_disk` takes (its `weight_version` is a string) and the one the
gateway's `POST /admin/weights` will forward to every engine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.trainer.checkpoint import save_model_weights
from envhub.trainer.errors import TrainerError
from envhub.trainer.lora import MergeShell

if TYPE_CHECKING:
    import torch

Push = Callable[[str], None]


def full_state(model: Any) -> dict[str, torch.Tensor]:
    """The whole model state on CPU: FSDP2 shards are gathered to rank 0 (every rank must
    call this; ranks other than 0 get an empty dict)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)  # type: ignore[return-value]


def export_weights(model: Any, root: str | Path, version: int, tokenizer: Any = None, *,
                   is_rank0: bool = True, merge: MergeShell | None = None) -> Path | None:
    """Write `root/v{version}` (an HF folder engines can load) and return its path.

    Collective under FSDP2 (the full state is gathered to rank 0, CPU-offloaded); only rank 0
    writes and gets the path, the others get None. A LoRA model is written merged (`merge`).
    """
    if not hasattr(model, "save_pretrained"):  # a plain module: its own tensors, rank 0 only
        if not is_rank0:
            return None
        folder = _version_folder(root, version)
        save_model_weights(model, folder)
        return folder
    state = full_state(model)
    if not is_rank0:
        return None
    folder = _version_folder(root, version)
    if merge is not None:
        merge.save_merged(state, folder)
    else:
        model.save_pretrained(folder, state_dict=state, safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return folder


def _version_folder(root: str | Path, version: int) -> Path:
    folder = Path(root) / f"v{version:06d}"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def post_weights(url: str, path: str | Path, *, version: int | None = None,
                 api_key: str | None = None, timeout: float = 600.0) -> dict[str, Any]:
    """POST the weights folder to an engine or gateway endpoint; raise with the fix on error."""
    import httpx

    body: dict[str, Any] = {"model_path": str(path)}
    if version is not None:
        body["weight_version"] = str(version)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.post(url, json=body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise TrainerError(f"weight push to {url} failed ({exc}); check that the gateway or "
                           "engine is running and the URL ends in the update endpoint") from exc
    if response.status_code >= 400:
        raise TrainerError(f"weight push to {url} -> {response.status_code}: "
                           f"{response.text[:300]}")
    try:
        data = response.json()
    except ValueError:
        return {}
    if isinstance(data, dict) and data.get("success") is False:  # SGLang's failure shape
        raise TrainerError(f"engine at {url} refused the weights: {data.get('message')}")
    return data if isinstance(data, dict) else {"response": data}


def http_pusher(url: str, *, api_key: str | None = None, timeout: float = 600.0) -> Push:
    """A `push(path)` callback for `Trainer.sync`; the version is read from the folder name."""

    def push(path: str) -> None:
        name = Path(path).name
        version = int(name[1:]) if name.startswith("v") and name[1:].isdigit() else None
        post_weights(url, path, version=version, api_key=api_key, timeout=timeout)

    return push
