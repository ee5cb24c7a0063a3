"""The verl and TRL recipes of trainer/README.md, run for one step on the bundled model from an
export of sessions the real gateway and its embedded engine recorded (two turns each, the
second turn's prompt holding a user message the model did not sample; an outcome reward and a
process penalty at the first turn, so advantages differ per token)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envhub.sdk import Session
from envhub.trainer.config import AdvantageConfig
from envhub.trainer.source import InMemorySource
from tests.support import envhub, gateway_in_thread

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow  # records sessions with the real engine, then two trainers
ADMIN_KEY = "export-recipes"
GROUP_SIZE = 2


def _play(url: str, group: str, index: int) -> tuple[str, int]:
    """A two-turn session of the real engine; returns its id and its first turn's seq."""
    session = Session.open(url, admin_key=ADMIN_KEY, group_id=group, task_id=group,
                           env="arith", sample_index=index)
    client = session.openai(max_retries=0)
    messages = [{"role": "user", "content": f"what is {index} + {len(group)}?"}]
    first = client.chat.completions.create(model="default", messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": first.choices[0].message.content or ""},
                 {"role": "user", "content": "Check it once more."}]
    client.chat.completions.create(model="default", messages=messages, max_tokens=8)
    seq0 = min(t.seq for t in session.trajectory().turns)
    session.reward("outcome", float(index))
    session.reward("process", -0.5, seq=seq0)
    session.close("done")
    return session.id, seq0


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A JSONL pool export of 2 groups x 2 sessions played through a real gateway."""
    from envhub.trainer.source import StoreSource

    tmp = tmp_path_factory.mktemp("recorded")
    gw = gateway_in_thread(tmp, admin_key=ADMIN_KEY)
    try:
        ids = [_play(gw.url, group, i)[0] for group in ("ga", "gbb") for i in range(GROUP_SIZE)]
        with StoreSource(gw.app.state.gw.store) as pool:
            trajectories = pool.fetch(ids)
    finally:
        gw.close()
    path = tmp / "pool.jsonl"
    path.write_text("".join(t.model_dump_json() + "\n" for t in trajectories))
    return path


def _export(recorded: Path, tmp_path: Path, fmt: str) -> Path:
    out = tmp_path / f"{fmt}.parquet"
    r = envhub("export", "--format", fmt, "--jsonl", str(recorded), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "wrote 4 sequences from 2 groups" in r.stdout
    return out


def test_verl_export_is_padded_in_verls_layout_with_per_token_advantages(
        recorded: Path, tmp_path: Path) -> None:
    from envhub.trainer.export_verl import read_verl

    tensors, non_tensors, meta = read_verl(_export(recorded, tmp_path, "verl"))
    source = InMemorySource.from_jsonl(recorded)
    by_id = {t.session.id: t for t in source.fetch([s.id for g in source.list_groups()
                                                     for s in g.sessions])}
    b, p = tensors["prompts"].shape
    r = tensors["responses"].shape[1]
    assert (b, p, r) == (4, meta["max_prompt_length"], meta["max_response_length"])
    assert tensors["input_ids"].shape == tensors["attention_mask"].shape == (b, p + r)
    for name in ("response_mask", "old_log_probs", "advantages", "rollout_log_probs"):
        assert tensors[name].shape == (b, r), name
    for i, sid in enumerate(non_tensors["session_id"]):
        seg = by_id[sid].segments[0]
        mask = tensors["attention_mask"][i].bool()
        assert tensors["input_ids"][i][mask].tolist() == seg.token_ids  # left/right padding
        assert tensors["position_ids"][i][mask].tolist() == list(range(len(seg.token_ids)))
        cut = seg.loss_mask.index(1)
        n_resp = len(seg.token_ids) - cut
        assert tensors["response_mask"][i, :n_resp].tolist() == seg.loss_mask[cut:]
        assert tensors["old_log_probs"][i, :n_resp].tolist() == pytest.approx(
            [lp if m else 0.0 for lp, m in zip(seg.logprobs[cut:], seg.loss_mask[cut:],
                                               strict=True)], abs=1e-6)
        # the second turn's user message sits inside the response, masked out
        assert 0 in seg.loss_mask[cut:]
        # reward-to-go: the first turn's penalty is not charged to the second turn's tokens
        adv = [a for a, m in zip(tensors["advantages"][i, :n_resp].tolist(),
                                 seg.loss_mask[cut:], strict=True) if m]
        first, last = adv[0], adv[-1]
        scale = 0.5 + AdvantageConfig().eps  # population std of rewards {-0.5, 0.5}
        assert last - first == pytest.approx(0.5 * AdvantageConfig().turn_coef / scale, rel=1e-4)
    assert sorted(set(non_tensors["uid"])) == ["ga", "gbb"]


def test_verl_recipe_runs_one_actor_step(recorded: Path, tmp_path: Path) -> None:
    """trainer/README.md's verl recipe: verl's DataProto and policy loss, one step."""
    from transformers import AutoModelForCausalLM

    from envhub.gateway.config import BUNDLED_MODEL
    from envhub.trainer.export_verl import load_dataproto
    from envhub.trainer.recipe_verl import actor_config, actor_step, response_log_probs

    data = load_dataproto(_export(recorded, tmp_path, "verl"))
    assert type(data).__module__ == "verl.protocol"
    model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL), dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    batch = data.batch
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        logp = response_log_probs(model, data)
    # the exported old log-probs are the engine's: the trainer's forward reproduces them
    assert (logp - batch["old_log_probs"])[mask].abs().max() < 1e-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    metrics = actor_step(model, optimizer, data, actor_config())
    # ratio ~ 1, so verl's token-mean clipped loss is -mean(A) over the response mask
    expected = -(batch["advantages"][mask]).mean().item()
    assert metrics["actor/pg_loss"] == pytest.approx(expected, abs=1e-3)
    assert abs(expected) > 1e-2  # the advantages do not cancel out: a real check
    assert abs(metrics["actor/ppo_kl"]) < 1e-3 and metrics["actor/grad_norm"] > 0
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters())
    assert moved > 0 and all(torch.isfinite(p).all() for p in model.parameters())


def test_trl_recipe_trains_one_step_with_grpotrainer(recorded: Path, tmp_path: Path) -> None:
    """trainer/README.md's TRL recipe: TRL's own GRPOTrainer, its rollout_func replaying the
    export, envhub's rewards as TRL's reward."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from envhub.gateway.config import BUNDLED_MODEL
    from envhub.trainer.export_trl import ExportReplay, envhub_reward

    replay = ExportReplay(_export(recorded, tmp_path, "trl"))
    model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL), dtype=torch.float32)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, max_steps=1,
                      per_device_train_batch_size=2 * GROUP_SIZE, num_generations=GROUP_SIZE,
                      learning_rate=1e-5, logging_steps=1, report_to=[], save_strategy="no",
                      bf16=False, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=envhub_reward, args=args,
                          train_dataset=replay.prompt_dataset(), rollout_func=replay,
                          processing_class=AutoTokenizer.from_pretrained(str(BUNDLED_MODEL)))
    trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["reward"] == pytest.approx(0.0, abs=1e-6)  # rewards -0.5, 0.5 per group
    assert logged["reward_std"] == pytest.approx(0.5774, abs=1e-3)  # of the 4 replayed rewards
    assert torch.isfinite(torch.tensor(logged["loss"]))
    moved = max((p.detach() - before[n]).abs().max().item() for n, p in model.named_parameters())
    assert moved > 0
