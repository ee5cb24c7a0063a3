"""TRL rows of exported training sequences, and what TRL's own GRPOTrainer needs to train on them.

TRL (1.x) documents `GRPOTrainer(rollout_func=...)` for externally generated rollouts: the
function gets the prompts of the batch and returns `prompt_ids`, `completion_ids`, `logprobs`
per completion; an `env_mask` field marks model-sampled tokens 1 and environment tokens 0 (a
multi-turn completion with tool output inside), and every other field goes to the reward
functions. `ExportReplay(path)` is such a function over a `--format trl` export: the training
dataset has one prompt per exported group (the group id, `prompt_dataset`); TRL's sampler
repeats it `num_generations` times, and the replay answers each repeat with the group's next
recorded sample: the exact token ids the engine saw and sampled, its logprobs, the loss mask,
and the envhub composite reward, which the reward function `envhub_reward` hands back to TRL.
TRL then computes its own group advantages from those rewards (one per sequence; TRL's loss has
no per-token advantages, so envhub's reward-to-go terms, in `token_advantages`, stay in the
file for trainers that take them). The live twin,
`envhub.orchestrator.trl_rollouts.EnvRollouts`, plays
environments through a gateway instead of replaying a file.
"""

from __future__ import annotations

from collections import defaultdict
from itertools import groupby
from pathlib import Path
from typing import Any

from envhub.trainer.batch import TrainSequence
from envhub.trainer.errors import TrainerError
from envhub.trainer.export_verl import split_prompt


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


def rollout_fields(row: dict[str, Any]) -> dict[str, Any]:
    """One TRL row as one completion of a `rollout_func`'s answer."""
    return {"prompt_ids": row["prompt_ids"], "completion_ids": row["completion_ids"],
            "logprobs": row["sampling_per_token_logps"], "env_mask": row["completion_mask"],
            "envhub_reward": row["reward"]}


class ExportReplay:
    """A TRL `rollout_func` answering each prompt (a group id) with that group's recorded
    samples, in order. The group size must equal the trainer's `num_generations`."""

    def __init__(self, path: str | Path) -> None:
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        if not rows or "completion_ids" not in rows[0]:
            raise TrainerError(f"{path}: not a TRL export with sequences; write one with "
                               "`envhub export --format trl`")
        self.groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            self.groups[row["group_id"]].append(row)

    def prompt_dataset(self) -> Any:
        """The training dataset: one row per group, `prompt` = the group id."""
        from datasets import Dataset

        return Dataset.from_dict({"prompt": list(self.groups)})

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = defaultdict(list)
        for group_id, repeats in groupby(prompts):
            samples = self.groups.get(str(group_id))
            if samples is None:
                raise TrainerError(f"prompt {group_id!r} is no group of this export; train on "
                                   "ExportReplay.prompt_dataset()")
            n = len(list(repeats))
            if n != len(samples):
                raise TrainerError(
                    f"group {group_id}: TRL asks for {n} completions, the export holds "
                    f"{len(samples)}; set GRPOConfig(num_generations={len(samples)})")
            for row in samples:
                for key, value in rollout_fields(row).items():
                    out[key].append(value)
        return dict(out)


def envhub_reward(prompts: list[Any], completions: list[Any], envhub_reward: list[float],
                  **kwargs: Any) -> list[float]:
    """TRL reward function: the composite reward envhub recorded for each replayed sample."""
    return [float(r) for r in envhub_reward]
