"""The live TRL recipe of trainer/README.md: TRL's GRPOTrainer with `EnvRollouts` as its
rollout_func plays the arith environment through a real gateway (embedded engine, bundled
model) for two steps; the completions TRL trains on are the pool's recorded tokens, the
rewards envhub's, and TRL's weights reach the engine before the second batch is played."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import gateway_in_thread

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # real rollouts on CPU, two TRL steps
ADMIN_KEY = "trl-live"


def test_grpotrainer_with_envhub_rollouts(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from envhub.gateway.config import BUNDLED_MODEL
    from envhub.orchestrator.catalog import load_env
    from envhub.orchestrator.trl_rollouts import EnvRollouts
    from envhub.trainer.advantages import composite_reward
    from envhub.trainer.config import AdvantageConfig
    from envhub.trainer.export_trl import envhub_reward
    from envhub.trainer.source import HttpSource

    gw = gateway_in_thread(tmp_path, admin_key=ADMIN_KEY)
    try:
        rollouts = EnvRollouts("arith", gw.url, ADMIN_KEY, tmp_path / "weights", max_turns=2)
        answers: list[dict[str, Any]] = []

        def observed(prompts: list[Any], trainer: Any) -> dict[str, Any]:
            answers.append(rollouts(prompts, trainer))
            return answers[-1]

        args = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, max_steps=2,
                          per_device_train_batch_size=2, num_generations=2, learning_rate=1e-5,
                          logging_steps=1, report_to=[], save_strategy="no", bf16=False,
                          seed=0)
        model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL), dtype=torch.float32)
        trainer = GRPOTrainer(model=model, reward_funcs=envhub_reward, args=args,
                              train_dataset=rollouts.prompt_dataset(tasks=2),
                              rollout_func=observed,
                              processing_class=AutoTokenizer.from_pretrained(str(BUNDLED_MODEL)))
        trainer.train()
        with HttpSource(gw.url, ADMIN_KEY) as source:
            infos = source.list_groups()
            trajectories = source.fetch([s.id for g in infos for s in g.sessions])
    finally:
        gw.close()
    # The composite of arith's manifest weights (process 0.1): with every weight 1.0 a sample
    # whose process reward was -1 read -1.0 where TRL was given, rightly, -0.1.
    weights = AdvantageConfig(reward_weights=load_env("arith").manifest.reward_weights())
    assert weights.reward_weights["process"] == 0.1
    assert trainer.state.global_step == 2 and len(answers) == 2
    assert len(infos) == 2 and all(len(g.sessions) == 2 for g in infos)
    # Two samples of a task can sample the very same tokens (a tiny model, short answers); their
    # logprobs then differ in the last bits (computed in different batches): match on both.
    recorded: dict[tuple, list] = {}
    for t in trajectories:
        for seg in t.segments:
            recorded.setdefault(tuple(seg.token_ids), []).append((seg, t))
    matched: set[str] = set()
    for answer in answers:
        assert len(answer["completion_ids"]) == 2
        for i in range(2):
            ids = tuple(answer["prompt_ids"][i] + answer["completion_ids"][i])
            cut = len(answer["prompt_ids"][i])
            same = [(seg, t) for seg, t in recorded[ids]  # exactly the tokens the engine saw
                    if answer["logprobs"][i] == pytest.approx(seg.logprobs[cut:])]
            assert same, (answer["logprobs"][i], [s.logprobs[cut:] for s, _ in recorded[ids]])
            # of those, a session not matched yet with this mask and reward (two solved samples
            # of the same tokens differ in their completion-time reward)
            match = [t for seg, t in same if t.session.id not in matched
                     and answer["env_mask"][i] == seg.loss_mask[cut:]
                     and answer["envhub_reward"][i] == pytest.approx(composite_reward(t, weights))]
            assert match, (answer["envhub_reward"][i], answer["env_mask"][i],
                           [(composite_reward(t, weights), seg.loss_mask[cut:]) for seg, t in same])
            matched.add(match[0].session.id)
    # TRL's step-1 weights were pushed before the second batch: its turns carry version 1
    versions = {g.group_id: {w for t in trajectories if t.session.group_id == g.group_id
                             for turn in t.turns for w in [turn.weight_version]}
                for g in infos}
    assert sorted(map(sorted, versions.values())) == [[0], [1]]
    assert (tmp_path / "weights" / "v000001" / "model.safetensors").is_file()
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history
               if "loss" in h)
