"""Export for other trainers (issue 7, item 7): flat Parquet, one row per training sequence
(a segment of a session), after the same filters and advantages the envhub trainer uses.

`verl`: padded tensors in verl's batch layout and field names, with the rollout log-probs as
`old_log_probs` and per-token advantages (export_verl.py); `DataProto.from_dict(*read_verl(p))`.
`trl` columns (names of TRL's GRPOTrainer batch): prompt_ids, completion_ids, completion_mask,
sampling_per_token_logps, advantages (per sequence, as TRL uses them), token_advantages (per
token, with the reward-to-go term of each turn), group_id, session_id, segment, reward.
`trl_rollout_func` (export_trl.py) feeds these rows to TRL's own GRPOTrainer.
The prompt is the run of tokens before the first sampled one; everything after it is the
response/completion, whose mask is 1 only on sampled tokens (tool outputs inside a multi-turn
response are 0), and whose logprobs are the rollout logprobs (0.0 off the mask).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from envhub.trainer.batch import build_batch
from envhub.trainer.config import TrainerConfig
from envhub.trainer.errors import TrainerError
from envhub.trainer.export_trl import trl_row
from envhub.trainer.export_verl import verl_table
from envhub.trainer.source import TrajectorySource
from envhub.trainer.window import GroupWindow

ExportFormat = Literal["verl", "trl"]


def export_parquet(source: TrajectorySource, out: str | Path, fmt: ExportFormat, *,
                   config: TrainerConfig | None = None, trainer_version: int = 0,
                   window: int | None = None, max_groups: int | None = None,
                   pad_token_id: int = 0) -> dict[str, float]:
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
    if fmt == "verl":
        table = verl_table(batch.sequences, pad_token_id)
    else:
        table = pa.Table.from_pylist([trl_row(s) for s in batch.sequences]) \
            if batch.sequences else pa.table({})
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        pq.write_table(table, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return batch.metrics()
