"""`envhub train` with the objectives chosen on its command line: a plug-in loss given by
dotted path trains (with another estimator, aggregation and a rollout correction), and a plug-in
that cannot work stops the command with exit 2 and what to fix, before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import envhub

pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]
RUN = ["arith", "--steps", "2", "--seed", "3", "--groups", "2", "--k", "2", "--tasks", "4",
       "--max-turns", "2", "--eval-every", "0", "--concurrency", "4", "--sync"]


@pytest.mark.slow
def test_a_plug_in_loss_trains_with_the_chosen_estimator_and_correction(tmp_path: Path) -> None:
    out = tmp_path / "run"
    # 4 x 4 samples a step: groups whose samples differ (the loss has something to train)
    done = envhub("train", *RUN, "--groups", "4", "--k", "4", "--max-turns", "3",
                  "--out", str(out), "--loss",
                  "tests.trainer.plugin_losses:vanilla_pg", "--advantage", "rloo",
                  "--loss-agg", "seq_mean", "--correction", "token_truncate", cwd=tmp_path,
                  env={"PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["phase"] == "train"]
    assert [r["step"] for r in train] == [0, 1]
    trained = [r for r in train if r["trainer/step/skipped"] == 0]
    assert trained and all(r["trainer/loss/tokens"] > 0 for r in trained), train
    for r in trained:  # the correction reports what it cut; the loss ran on every token
        assert 0 <= r["trainer/correction/cut_fraction"] <= 1, r
        assert r["trainer/correction/weight_mean"] > 0, r
        assert r["trainer/is/masked_fraction"] == 0  # a plug-in keeps every token's gradient
    config = json.loads((out / "run.json").read_text())["config"]
    assert config["loss"] == "tests.trainer.plugin_losses:vanilla_pg"
    assert config["advantage"] == "rloo" and config["correction"] == "token_truncate"


@pytest.mark.parametrize(("name", "says"), [
    ("tests.trainer.plugin_losses:not_finite", "not finite"),
    ("tests.trainer.plugin_losses:two_arguments", "one argument"),
    ("tests.trainer.plugin_losses:nowhere", "cannot import"),
])
def test_a_plug_in_loss_that_cannot_work_exits_2_before_anything_is_written(
        tmp_path: Path, name: str, says: str) -> None:
    out = tmp_path / "run"
    r = envhub("train", *RUN, "--out", str(out), "--loss", name, cwd=tmp_path,
               env={"PYTHONPATH": str(REPO)}, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    assert says in r.stderr and "--loss" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert not out.exists()


@pytest.mark.slow
def test_dynamic_sampling_takes_more_groups_until_a_step_has_signal_within_its_bound(
        tmp_path: Path) -> None:
    """DAPO's dynamic sampling on arith with the tiny model, where most groups score alike
    (no gradient): each step takes groups until --groups of them train, or until it took
    --dynamic-sampling-max extra; the extras are consumed (trained on or dropped, counted),
    never trained again."""
    out = tmp_path / "run"
    done = envhub("train", *RUN, "--out", str(out), "--dynamic-sampling",
                  "--dynamic-sampling-max", "6", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [r for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
            if r["phase"] == "train"]
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        extra = r["trainer/dynamic/extra_groups"]
        assert 0 <= extra <= 6 and r["groups_trained"] == 2 + extra, r
        trained = r["trainer/batch/groups"]
        assert trained == r["trainer/dynamic/signal_groups"]
        # the rule: a full step of groups that train, or the bound spent
        assert trained == 2 or (extra == 6 and r["trainer/dynamic/bound_reached"] == 1), r
        assert r.get("trainer/drop_groups/no_signal", 0) == r["groups_trained"] - trained, r
    assert sum(r["trainer/dynamic/extra_groups"] for r in rows) >= 1, rows
    trained_ids = [g for r in rows for g in r["groups"]]
    assert len(trained_ids) == len(set(trained_ids))  # no group in two steps
