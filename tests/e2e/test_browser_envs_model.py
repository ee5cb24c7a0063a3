"""The built-in tool-calling agent with the bundled model on `slides` and `webtask`, through
`envhub run` like a user: the model does not solve them, but every rollout ends `done`, is
recorded token-exact (each segment is its turns' prompt deltas and sampled ids, the loss mask
on the sampled ids only) and is scored (outcome and, for slides, the layout process signals)."""

from __future__ import annotations

import json

import pytest

from tests.support import envhub, require_browser, require_tool, run_leftovers

pytest.importorskip("torch")


def run_and_export(env: str, tmp_path) -> list[dict]:
    ran = envhub("run", env, "-n", "1", "--max-turns", "2", "--out", "out", "-q", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["overall"]["done"] == 1 and summary["overall"]["env_failure"] == 0, summary
    assert not run_leftovers(summary["run_id"])
    out = envhub("export", "--db", f"sqlite:///{tmp_path}/out/pool.db", "--format", "jsonl",
                 "--out", "t.jsonl", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]


def assert_token_exact(row: dict) -> None:
    assert row["status"] == "done" and row["turns"]
    turns = {t["seq"]: t for t in row["turns"]}
    for segment in row["segments"]:
        ids, mask = segment["token_ids"], segment["loss_mask"]
        assert len(ids) == len(mask) == len(segment["logprobs"]) == len(
            segment["weight_versions"])
        rebuilt: list[int] = []
        sampled: list[int] = []
        for seq in segment["turn_seqs"]:
            rebuilt += turns[seq]["prompt_delta_ids"] + turns[seq]["completion_ids"]
            sampled += turns[seq]["completion_ids"]
        assert ids == rebuilt
        assert [i for i, m in zip(ids, mask, strict=True) if m] == sampled and sampled


@pytest.mark.slow
@pytest.mark.browser
def test_bundled_model_on_slides_is_recorded_and_scored(tmp_path):
    require_browser()
    [row] = run_and_export("slides", tmp_path)
    assert_token_exact(row)
    [outcome] = [e for e in row["rewards"] if e["kind"] == "outcome"]
    assert set(outcome["info"]["checks"]) == {"overflow", "clipped", "overlap", "min_font",
                                              "slide_count", "required_content"}
    layout = {e["name"] for e in row["rewards"] if e["kind"] == "process"}
    assert layout and all(name.startswith("layout_") for name in layout)  # it does not solve it


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.bwrap
def test_bundled_model_on_webtask_is_recorded_and_scored(tmp_path):
    require_browser()
    require_tool("bwrap")
    [row] = run_and_export("webtask", tmp_path)
    assert_token_exact(row)
    assert [e["kind"] for e in row["rewards"]].count("outcome") == 1
