"""verl's batch layout for exported training sequences (verl 0.9 field names).

verl's actor consumes a `DataProto` whose tensors come out of its rollout already padded:

    prompts         (B, P)    left-padded prompt ids (P = longest prompt of the export)
    responses       (B, R)    right-padded response ids (R = longest response)
    input_ids       (B, P+R)  prompts ++ responses
    attention_mask  (B, P+R)  1 on real tokens, 0 on padding
    position_ids    (B, P+R)  cumsum(attention_mask) - 1, clipped at 0 (verl's
                              `compute_position_id_with_mask`)
    response_mask   (B, R)    1 on sampled tokens only (tool output inside a multi-turn
                              response is 0, as verl's multi-turn rollout sets it)
    old_log_probs   (B, R)    behaviour-policy log-probs: the rollout's own (bypass mode, no
                              recompute); 0 off the mask
    rollout_log_probs (B, R)  the same values under the name verl's rollout correction reads
    advantages      (B, R)    per token: GRPO advantage plus the reward-to-go term of the turn
                              that sampled the token (advantages.py); 0 off the mask
    token_level_rewards (B, R) the composite reward on the last sampled token (verl's layout)

plus the non-tensor `uid` (group id, verl's GRPO key), `session_id`, `segment`, and the meta
info {pad_token_id, max_prompt_length, max_response_length}. In Parquet every tensor row is a
fixed-length list and the meta info sits in the schema metadata under b"envhub.verl".
`read_verl(path)` returns `(tensors, non_tensors, meta_info)` in the order of
`verl.DataProto.from_dict`, so `DataProto.from_dict(*read_verl(path))` loads an export.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.trainer.batch import TrainSequence
from envhub.trainer.errors import MissingExtra, TrainerError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import torch

META_KEY = b"envhub.verl"
TENSOR_FIELDS = ("prompts", "responses", "input_ids", "attention_mask", "position_ids",
                 "response_mask", "old_log_probs", "rollout_log_probs", "advantages",
                 "token_level_rewards")
NON_TENSOR_FIELDS = ("uid", "session_id", "segment")
FLOAT_FIELDS = {"old_log_probs", "rollout_log_probs", "advantages", "token_level_rewards"}


def split_prompt(seq: TrainSequence) -> int:
    """Index of the first sampled token (the prompt is everything before it)."""
    return next(i for i, m in enumerate(seq.loss_mask) if m)


def verl_rows(sequences: list[TrainSequence], pad_token_id: int = 0
              ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One padded row per sequence (every list of a field has the same length) + meta info."""
    cuts = [split_prompt(s) for s in sequences]
    p_len = max(cuts, default=0)
    r_len = max((len(s.token_ids) - c for s, c in zip(sequences, cuts, strict=True)), default=0)
    rows = []
    for seq, cut in zip(sequences, cuts, strict=True):
        prompt, response = seq.token_ids[:cut], seq.token_ids[cut:]
        left, right = p_len - len(prompt), r_len - len(response)
        attention = [0] * left + [1] * (len(prompt) + len(response)) + [0] * right
        positions, n = [], 0
        for a in attention:  # cumsum(mask) - 1, clipped at 0
            n += a
            positions.append(max(n - 1, 0))
        logprobs = seq.rollout_logprobs[cut:] + [0.0] * right
        last = max(i for i, m in enumerate(seq.loss_mask[cut:]) if m)
        rewards = [0.0] * r_len
        rewards[last] = seq.reward
        rows.append({
            "prompts": [pad_token_id] * left + prompt,
            "responses": response + [pad_token_id] * right,
            "input_ids": [pad_token_id] * left + seq.token_ids + [pad_token_id] * right,
            "attention_mask": attention, "position_ids": positions,
            "response_mask": seq.loss_mask[cut:] + [0] * right,
            "old_log_probs": logprobs, "rollout_log_probs": list(logprobs),
            "advantages": seq.advantages[cut:] + [0.0] * right,
            "token_level_rewards": rewards,
            "uid": seq.group_id, "session_id": seq.session_id, "segment": seq.segment,
        })
    meta = {"pad_token_id": pad_token_id, "max_prompt_length": p_len,
            "max_response_length": r_len}
    return rows, meta


def verl_table(sequences: list[TrainSequence], pad_token_id: int = 0) -> pa.Table:
    import pyarrow as pa

    rows, meta = verl_rows(sequences, pad_token_id)
    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    return table.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})


def read_verl(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray],
                                        dict[str, Any]]:
    """(tensors, non_tensors, meta_info) of a verl export: `DataProto.from_dict(*...)`."""
    import numpy as np
    import pyarrow.parquet as pq

    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingExtra("reading a verl export as tensors", "train") from exc
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise TrainerError(f"{path}: not an envhub verl export (no {META_KEY.decode()} "
                           "metadata); write one with `envhub export --format verl`")
    if table.num_rows == 0:
        raise TrainerError(f"{path}: the export holds no sequences (nothing to train on)")
    tensors = {}
    for name in TENSOR_FIELDS:
        dtype = torch.float32 if name in FLOAT_FIELDS else torch.long
        tensors[name] = torch.tensor(table.column(name).to_pylist(), dtype=dtype)
    non_tensors = {name: np.array(table.column(name).to_pylist(), dtype=object)
                   for name in NON_TENSOR_FIELDS}
    return tensors, non_tensors, json.loads(raw)


def load_dataproto(path: str | Path) -> Any:
    """The export as a `verl.DataProto` (needs `pip install envhub[recipes]`)."""
    try:
        from verl import DataProto
    except ImportError as exc:
        raise MissingExtra("loading a verl export into verl", "recipes") from exc
    return DataProto.from_dict(*read_verl(path))
