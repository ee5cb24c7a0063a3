"""`Trainer.step` end to end on a real model: updates, equivalences, checkpoints, sync."""

from __future__ import annotations

import pytest
import torch

from envhub.trainer.config import OptimConfig, TrainerConfig
from envhub.trainer.source import Group, InMemorySource
from envhub.trainer.synthetic import RolloutShape, sample_group
from envhub.trainer.trainer import Trainer
from envhub.trainer.weights import http_pusher
from envhub.trainer.window import GroupWindow
from tests.trainer.models import tiny_model

SHAPE = RolloutShape(sessions=4, turns=4, prompt_len=16, cm_every=2, keep_prompt=8)


@pytest.fixture(scope="module")
def groups() -> list[Group]:
    sampler = tiny_model("qwen2", seed=1)
    return [Group(f"g{i}", sample_group(sampler, f"g{i}", SHAPE, seed=i, created_at=float(i)))
            for i in range(3)]


def _config(**kw) -> TrainerConfig:
    # A large lr so one step visibly moves the weights. adam_eps 1e-4 keeps AdamW's first step
    # g / (|g| + eps) smooth: with 1e-8 it is sign(g), and rounding noise on a near-zero
    # gradient would flip whole updates, hiding real equivalence behind noise.
    return TrainerConfig(optim=OptimConfig(lr=1e-2, max_grad_norm=1.0, adam_eps=1e-4), **kw)


def _params(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def _max_diff(a: dict, b: dict) -> float:
    return max((a[n] - b[n]).abs().max().item() for n in a)


def test_step_updates_and_reports_metrics(groups) -> None:
    model = tiny_model("qwen2")
    before = _params(model)
    metrics = Trainer(model, _config()).step(groups)
    assert _max_diff(before, _params(model)) > 1e-4
    assert metrics["step"] == 1 and metrics["step/skipped"] == 0
    assert metrics["batch/groups"] == 3 and metrics["batch/sequences"] == 3 * 4 * 2
    assert 0 < metrics["tokens/packed"] < metrics["tokens/naive"]
    assert 0 <= metrics["is/masked_fraction"] <= 1
    for key in ("is/ratio_mean", "policy/entropy", "kl/rollout_train_k3", "grad/norm"):
        assert key in metrics


def test_merged_step_equals_unmerged_and_split_steps(groups) -> None:
    results = []
    for cfg in (_config(), _config(prefix_merge=False), _config(max_tokens_per_forward=64)):
        model = tiny_model("qwen2")
        m = Trainer(model, cfg).step(groups)
        results.append((_params(model), m))
    (p_tree, m_tree), (p_naive, m_naive), (p_split, _) = results
    assert m_tree["tokens/packed"] < m_naive["tokens/packed"] == m_naive["tokens/naive"]
    assert _max_diff(p_tree, p_naive) < 1e-6
    assert _max_diff(p_tree, p_split) < 1e-6
    assert m_tree["is/masked_fraction"] == m_naive["is/masked_fraction"]


OBJECTIVES = {  # every loss, aggregation, correction and estimator the trainer offers
    "ppo_clip": {"loss": {"name": "ppo_clip"}},
    "gspo": {"loss": {"name": "gspo", "agg": "seq_mean", "seq_eps_low": 0.5,
                      "seq_eps_high": 0.5}},
    "cispo": {"loss": {"name": "cispo"}},
    "plugin": {"loss": {"name": "tests.trainer.plugin_losses:vanilla_pg"}},
    "constant": {"loss": {"agg": "constant", "agg_constant": 64.0}},
    "token_truncate": {"loss": {"name": "ppo_clip", "correction": "token_truncate"}},
    "token_mask": {"loss": {"correction": "token_mask", "correction_cap": 1.5}},
    "sequence_truncate": {"loss": {"name": "cispo", "correction": "sequence_truncate"}},
    "sequence_mask": {"loss": {"name": "gspo", "correction": "sequence_mask",
                               "correction_cap": 1e6}},
    "rloo": {"advantages": {"estimator": "rloo"}},
    "reinforce_pp": {"advantages": {"estimator": "reinforce_pp"}},
    # LoRA trains adapters only: the same objectives through them
    "lora_gspo_rloo": {"lora": {"rank": 4, "alpha": 8}, "advantages": {"estimator": "rloo"},
                       "loss": {"name": "gspo", "agg": "seq_mean", "seq_eps_low": 0.5,
                                "seq_eps_high": 0.5, "correction": "sequence_truncate"}},
    "lora_cispo_constant": {"lora": {"rank": 4, "alpha": 8},
                            "loss": {"name": "cispo", "agg": "constant", "agg_constant": 64.0,
                                     "correction": "token_mask", "correction_cap": 1.5}},
}


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_every_objective_trains_the_same_merged_unmerged_and_split(groups, name) -> None:
    """A packed prefix tree, one branch per sequence, and small trees (several forwards):
    the same update within 1e-6 for each objective (sequence-level terms included: a
    sequence is never split across forwards)."""
    results = []
    for extra in ({}, {"prefix_merge": False}, {"max_tokens_per_forward": 64}):
        cfg = TrainerConfig.model_validate({**OBJECTIVES[name], **extra})
        torch.manual_seed(0)  # LoRA's adapters are drawn from the RNG: the same each time
        trainer = Trainer(tiny_model("qwen2"), cfg.model_copy(update={"optim": _config().optim}))
        before = _params(trainer.model)
        m = trainer.step(groups)
        results.append((_params(trainer.model), m))
        assert _max_diff(before, results[-1][0]) > 1e-4, name  # it trained
    (p_tree, m_tree), (p_naive, m_naive), (p_split, _) = results
    assert m_tree["tokens/packed"] < m_naive["tokens/packed"]
    assert _max_diff(p_tree, p_naive) < 1e-6 and _max_diff(p_tree, p_split) < 1e-6
    assert m_tree["loss/pg"] == pytest.approx(m_naive["loss/pg"], abs=1e-6)
    if "correction" in OBJECTIVES[name].get("loss", {}):
        assert "correction/cut_fraction" in m_tree


def test_nothing_trainable_skips_the_optimizer(groups) -> None:
    model = tiny_model("qwen2")
    before = _params(model)
    stale = TrainerConfig.model_validate({"filters": {"tau": 0}})
    trainer = Trainer(model, stale, version=5)  # every sample is 5 versions old
    metrics = trainer.step(groups)
    assert metrics["step/skipped"] == 1 and metrics["drop/stale"] == 12
    assert _max_diff(before, _params(model)) == 0 and trainer.steps == 0


def test_checkpoint_resume_continues_identically(groups, tmp_path) -> None:
    source = InMemorySource([t for g in groups for t in g.trajectories])
    window = GroupWindow(source, window=2)
    a = Trainer(tiny_model("qwen2"), _config(), version=3)
    a.step(window.take(1))
    ckpt = a.save_checkpoint(tmp_path / "ckpt", window)
    a.step(groups[1:])
    # A different initialisation, restored from the checkpoint, must land on the same weights.
    resumed_window = GroupWindow(source, window=2)
    b = Trainer(tiny_model("qwen2", seed=7), _config())
    b.load_checkpoint(ckpt, resumed_window)
    assert (b.version, b.steps, resumed_window.consumed) == (3, 1, {"g0"})
    b.step(groups[1:])
    assert _max_diff(_params(a.model), _params(b.model)) < 1e-6
    assert not list(tmp_path.glob(".ckpt.*"))  # no temp folders left behind
    a.save_checkpoint(ckpt)  # overwriting an existing checkpoint works too


def test_sync_exports_pushes_and_bumps_version(tmp_path) -> None:
    """The trainer's weights reach a real `envhub engine` (bundled model) over SGLang's
    /update_weights_from_disk: the engine reports the new version and samples exactly what the
    trained model computes (greedy tokens of a prompt)."""
    import httpx
    from transformers import AutoModelForCausalLM

    from envhub.gateway.engine.process import EngineProcess
    from tests.trainer.models import TINY

    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    cfg = _config()
    cfg.optim.reset_optimizer_on_sync = True
    trainer = Trainer(model, cfg)
    sampler = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    trainer.step([Group("g", sample_group(sampler, "g", RolloutShape(sessions=2, turns=2,
                                                                       prompt_len=8), seed=0))])
    assert trainer.optimizer.state
    prompt = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    with EngineProcess(["--threads", "1"], log_path=tmp_path / "engine.log") as engine:
        before = httpx.post(engine.url + "/v1/completions", json=body, timeout=120).json()
        path = trainer.sync(tmp_path / "weights",
                            http_pusher(f"{engine.url}/update_weights_from_disk"))
        version = httpx.get(engine.url + "/get_weight_version", timeout=30).json()
        after = httpx.post(engine.url + "/v1/completions", json=body, timeout=120).json()
    assert trainer.version == 1 and not trainer.optimizer.state
    assert str(version.get("weight_version")) == "1", version
    assert after["weight_version"] == 1 and before["weight_version"] == 0
    reloaded = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    assert _max_diff(_params(model), _params(reloaded)) == 0
    with torch.no_grad():  # greedy decode with the exported weights
        ids = list(prompt)
        for _ in range(6):
            ids.append(int(reloaded(torch.tensor([ids])).logits[0, -1].argmax()))
    assert after["choices"][0]["token_ids"] == ids[len(prompt):]


def test_failed_push_names_the_url(tmp_path) -> None:
    from envhub.trainer.errors import TrainerError
    from tests.support import free_port

    trainer = Trainer(tiny_model("qwen2"), _config())
    push = http_pusher(f"http://127.0.0.1:{free_port()}/update_weights_from_disk", timeout=2)
    with pytest.raises(TrainerError, match="weight push to http://127.0.0.1"):
        trainer.sync(tmp_path, push)
    assert trainer.version == 0  # a failed push does not claim a new version


def test_kl_needs_a_reference() -> None:
    with pytest.raises(ValueError, match="reference"):
        Trainer(tiny_model("qwen2"), TrainerConfig.model_validate({"loss": {"kl_coef": 0.1}}))


def test_kl_to_reference_runs(groups) -> None:
    cfg = TrainerConfig.model_validate({"loss": {"kl_coef": 0.1}, "optim": {"lr": 1e-2}})
    trainer = Trainer(tiny_model("qwen2"), cfg, reference=tiny_model("qwen2", seed=3))
    assert trainer.step(groups[:1])["kl/ref_k3"] > 0
