"""A TRL `rollout_func` that plays envhub environments through a gateway (live TRL recipe).

TRL's `GRPOTrainer(rollout_func=...)` hands the function the batch's prompts (each repeated
`num_generations` times by TRL's sampler) and wants, per completion, `prompt_ids`,
`completion_ids`, `logprobs`, optionally `env_mask` (1 on sampled tokens, 0 on tool output),
and any extra field for the reward functions. `EnvRollouts(env, gateway_url, admin_key)`:

- the dataset is the environment's task ids (`prompt_dataset()`); a run of equal prompts is one
  GRPO group, played by envhub's runner (`envhub run`'s code: sandbox, built-in agent, verifier,
  composite reward) through the gateway, which records the exact token ids and logprobs;
- the group is read back from the pool and filtered like the envhub trainer does: env failures
  are left out and the group padded with repeats of valid samples, or, under half valid,
  played again (at most `attempts` times, then an error: an infrastructure failure is never
  scored as reward 0);
- each sample's last trainable segment becomes one TRL completion (everything from the first
  sampled token on, tool output inside it masked by `env_mask`), with `envhub_reward` (the
  composite reward) for `envhub.trainer.export_trl.envhub_reward`;
- before playing a batch after an optimizer step, TRL's current weights are saved and pushed to
  the gateway's engines (`POST /admin/weights`), so rollouts sample from the policy being
  trained. The gateway must start from the same model as the TRL trainer.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from itertools import groupby
from pathlib import Path
from typing import Any

import httpx

from envhub.trainer.batch import TrainSequence
from envhub.trainer.config import FilterConfig
from envhub.trainer.errors import TrainerError
from envhub.trainer.export_trl import rollout_fields, trl_row
from envhub.trainer.filters import DropCounts, filter_group
from envhub.trainer.source import HttpSource, load_group


class EnvRollouts:
    """TRL rollout function over an envhub environment served through `gateway_url`."""

    def __init__(self, env: str, gateway_url: str, admin_key: str, weights_dir: str | Path, *,
                 max_turns: int | None = None, concurrency: int = 4, attempts: int = 3,
                 reward_weights: dict[str, float] | None = None) -> None:
        self.env, self.url, self.admin_key = env, gateway_url.rstrip("/"), admin_key
        self.weights_dir = Path(weights_dir)
        self.max_turns, self.concurrency, self.attempts = max_turns, concurrency, attempts
        self.reward_weights = reward_weights
        self.pushed_step = 0  # the gateway starts with the model TRL starts from
        self.version = 0

    def prompt_dataset(self, tasks: int | None = None) -> Any:
        """The environment's task ids (the first `tasks` of them) as TRL's `prompt` column."""
        from datasets import Dataset

        from envhub.orchestrator.catalog import load_env

        ids = [t.id for t in load_env(self.env).env.load_tasks()]
        return Dataset.from_dict({"prompt": ids[:tasks]})

    def __call__(self, prompts: list[Any], trainer: Any = None) -> dict[str, list[Any]]:
        if trainer is not None and trainer.state.global_step != self.pushed_step:
            self.push(trainer)
        runs = [(str(task), len(list(rep))) for task, rep in groupby(prompts)]
        out: dict[str, list[Any]] = defaultdict(list)
        for task, k in runs:
            for sample in self.play_group(task, k):
                for key, value in rollout_fields(trl_row(sample)).items():
                    out[key].append(value)
        return dict(out)

    def play_group(self, task: str, k: int) -> list[TrainSequence]:
        """k samples of `task`: played, read back, filtered; replayed while under half valid."""
        from envhub.orchestrator.groups.config import EnvChoice, RunConfig
        from envhub.orchestrator.groups.run import run

        for _ in range(self.attempts):
            outcome = asyncio.run(run(RunConfig(
                envs=[EnvChoice(ref=self.env)], k=k, tasks=[task], n=1, gateway=self.url,
                admin_key=self.admin_key, concurrency=self.concurrency,
                max_turns=self.max_turns), progress=False))
            group_ids = {r.group_id for r in outcome.records}
            with HttpSource(self.url, self.admin_key) as source:
                infos = [g for g in source.list_groups() if g.group_id in group_ids]
                groups = [load_group(source, info) for info in infos]
            for group in groups:
                kept = filter_group(group, FilterConfig(group_size=k, tau=None),
                                    self.version, DropCounts())
                if kept is not None:
                    return [self.last_segment(t) for t in kept.samples]
        raise TrainerError(f"task {task}: fewer than half of {k} rollouts finished in "
                           f"{self.attempts} attempts (env_failure); see `envhub run` results")

    def last_segment(self, t: Any) -> TrainSequence:
        from envhub.trainer.advantages import composite_reward
        from envhub.trainer.config import AdvantageConfig

        if self.reward_weights is None:  # the environment's manifest, never the events'
            from envhub.orchestrator.catalog import load_env

            self.reward_weights = load_env(self.env).manifest.reward_weights()
        config = AdvantageConfig(reward_weights=self.reward_weights)
        seg = [s for s in t.segments if any(s.loss_mask)][-1]
        return TrainSequence(
            session_id=t.session.id, group_id=t.session.group_id or "", segment=seg.index,
            token_ids=list(seg.token_ids), loss_mask=list(seg.loss_mask),
            rollout_logprobs=list(seg.logprobs), advantages=[0.0] * len(seg.token_ids),
            reward=composite_reward(t, config))

    def push(self, trainer: Any) -> None:
        """Save TRL's current weights and load them into the gateway's engines (version+1)."""
        from envhub.trainer.weights import export_weights

        model = trainer.accelerator.unwrap_model(trainer.model)
        folder = export_weights(model, self.weights_dir, self.version + 1,
                                tokenizer=trainer.processing_class)
        r = httpx.post(f"{self.url}/admin/weights", json={"path": str(folder)},
                       headers={"authorization": f"Bearer {self.admin_key}"}, timeout=600)
        if r.status_code >= 400:
            raise TrainerError(f"weight push to {self.url} -> {r.status_code}: {r.text[:300]}")
        self.version += 1
        self.pushed_step = trainer.state.global_step
