"""Export for other trainers (issue 7, item 7): flat Parquet, one row per training sequence
(a segment of a session), after the same filters and advantages the envhub trainer uses.

`verl` columns (names of verl's DataProto batch): prompts, responses, input_ids,
attention_mask, position_ids, response_mask, rollout_log_probs, advantages, plus uid (the
group id, verl's GRPO grouping key), session_id, segment, reward.
`trl` columns (names of TRL's GRPOTrainer batch): prompt_ids, completion_ids, completion_mask,
sampling_per_token_logps, advantages (per sequence, as TRL uses them), token_advantages,
group_id, session_id, segment, reward.
The prompt is the run of tokens before the first sampled one; everything after it is the
response/completion, whose mask is 1 only on sampled tokens (tool outputs inside a multi-turn
response are 0), and whose logprobs are the rollout logprobs (0.0 off the mask).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from envhub.trainer.batch import TrainSequence, build_batch
from envhub.trainer.config import TrainerConfig
from envhub.trainer.errors import TrainerError
from envhub.trainer.source import TrajectorySource
from envhub.trainer.window import GroupWindow

ExportFormat = Literal["verl", "trl"]


def split_prompt(seq: TrainSequence) -> int:
    """Index of the first sampled token (the prompt is everything before it)."""
    return next(i for i, m in enumerate(seq.loss_mask) if m)


def verl_row(seq: TrainSequence) -> dict[str, Any]:
    p = split_prompt(seq)
    n = len(seq.token_ids)
    return {
        "uid": seq.group_id, "session_id": seq.session_id, "segment": seq.segment,
        "prompts": seq.token_ids[:p], "responses": seq.token_ids[p:],
        "input_ids": seq.token_ids, "attention_mask": [1] * n, "position_ids": list(range(n)),
        "response_mask": seq.loss_mask[p:], "rollout_log_probs": seq.rollout_logprobs[p:],
        "advantages": seq.advantages[p:], "reward": seq.reward,
    }


def trl_row(seq: TrainSequence) -> dict[str, Any]:
    p = split_prompt(seq)
    return {
        "group_id": seq.group_id, "session_id": seq.session_id, "segment": seq.segment,
        "prompt_ids": seq.token_ids[:p], "completion_ids": seq.token_ids[p:],
        "completion_mask": seq.loss_mask[p:],
        "sampling_per_token_logps": seq.rollout_logprobs[p:],
        "advantages": seq.sample_advantage, "token_advantages": seq.advantages[p:],
        "reward": seq.reward,
    }


def export_parquet(source: TrajectorySource, out: str | Path, fmt: ExportFormat, *,
                   config: TrainerConfig | None = None, trainer_version: int = 0,
                   window: int | None = None, max_groups: int | None = None) -> dict[str, float]:
    """Write every finished group the window allows to `out`; return the batch metrics.

    The file is written to a temp name and renamed, so a failure leaves no partial file.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if fmt not in ("verl", "trl"):
        raise TrainerError(f"unknown export format {fmt!r}; use 'verl' or 'trl'")
    config = config or TrainerConfig()
    groups = GroupWindow(source, window, group_size=config.filters.group_size).take(
        max_groups if max_groups is not None else 1 << 62)
    batch = build_batch(groups, config, trainer_version)
    make = verl_row if fmt == "verl" else trl_row
    table = pa.Table.from_pylist([make(s) for s in batch.sequences]) if batch.sequences else \
        pa.table({})
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return batch.metrics()
