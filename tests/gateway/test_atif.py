"""`envhub export --format atif`: a real recorded run (`envhub run arith` with the bundled
model) exported to Harbor's ATIF and validated against Harbor's schema.

Harbor's package needs Python >= 3.12, so it is not a dependency here: the schema is the JSON
Schema of Harbor 0.25.0's pydantic models (data/atif-harbor-0.25.0.schema.json), and the
rules its model validators add are checked below. Where `harbor` imports, its own
`Trajectory` model validates the export too.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from envhub.sdk import Trajectory
from tests.gateway.conftest import CALC_TOOL, scripted, start, tool_call_text
from tests.support import envhub

SCHEMA = Path(__file__).parent / "data" / "atif-harbor-0.25.0.schema.json"
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


def check_atif(doc: dict) -> None:
    """Harbor's schema plus its model validators' rules (JSON Schema cannot say them)."""
    jsonschema.validate(doc, json.loads(SCHEMA.read_text()))
    assert [s["step_id"] for s in doc["steps"]] == list(range(1, len(doc["steps"]) + 1))
    for step in doc["steps"]:
        if step["source"] != "agent":
            assert not [f for f in AGENT_ONLY if step.get(f) is not None], step
        calls = {c["tool_call_id"] for c in step.get("tool_calls") or []}
        for result in (step.get("observation") or {}).get("results", []):
            assert result.get("source_call_id") in calls | {None}
    try:
        from harbor.models.trajectories import Trajectory as HarborTrajectory
    except ImportError:
        return
    HarborTrajectory.model_validate(doc)


@pytest.mark.slow
def test_atif_export_of_a_recorded_run_validates_and_keeps_the_tokens(tmp_path: Path) -> None:
    run = tmp_path / "run"
    result = envhub("run", "arith", "-n", "1", "-k", "2", "-q", "--out", str(run), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    db = f"sqlite:///{run}/pool.db"
    result = envhub("export", "--db", db, "--format", "atif", "--out", str(tmp_path / "t.atif"))
    assert result.returncode == 0, result.stderr
    assert "wrote 2 ATIF trajectories" in result.stdout
    docs = [json.loads(line) for line in (tmp_path / "t.atif").read_text().splitlines()]
    result = envhub("export", "--db", db, "--format", "jsonl", "--out", str(tmp_path / "t.jsonl"))
    assert result.returncode == 0, result.stderr
    recorded = {t.session.id: t for t in map(Trajectory.model_validate_json,
                                             (tmp_path / "t.jsonl").read_text().splitlines())}
    assert sorted(d["session_id"] for d in docs) == sorted(recorded)
    for doc in docs:
        check_atif(doc)
        traj = recorded[doc["session_id"]]
        assert len(doc["steps"]) == len(traj.turns) > 0
        for step, turn in zip(doc["steps"], sorted(traj.turns, key=lambda t: t.seq),
                              strict=True):
            metrics = step["metrics"]
            assert metrics["prompt_token_ids"] == turn.prompt_ids
            assert metrics["completion_token_ids"] == turn.completion_ids
            assert metrics["logprobs"] == pytest.approx(turn.completion_logprobs)
            assert step["extra"]["weight_version"] == turn.weight_version
            assert [c["tool_call_id"] for c in step.get("tool_calls", [])] == [
                c.id for c in turn.tool_calls]
        extra = doc["extra"]["envhub"]
        assert extra["status"] == traj.status.value and extra["task_id"] == traj.session.task_id
        assert doc["final_metrics"]["extra"]["reward"] == pytest.approx(traj.total_reward())


def test_tool_calls_malformed_calls_and_messages(tmp_path: Path, renderer) -> None:
    """A real gateway (scripted backend) records a tool call, a malformed call and a plain
    answer in one conversation: ATIF steps keep each call's id and arguments, the malformed
    one is text with its process signal, messages are decoded; a session without model calls
    is skipped."""
    import openai

    bad = tool_call_text("1+1").replace('"expr": "1+1"', '"expr": 1+')
    gw = start(tmp_path, scripted(renderer, [tool_call_text("2*3"), bad, "It is 6."]))
    try:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="atif-a", max_retries=0)
        messages: list = [{"role": "user", "content": "2*3?"}]
        for _ in range(3):
            reply = c.chat.completions.create(model="default", messages=messages,
                                              tools=[CALC_TOOL]).choices[0].message
            messages.append(reply.model_dump(exclude_none=True))
            messages += [{"role": "tool", "tool_call_id": call.id, "content": "6"}
                         for call in reply.tool_calls or []]
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="atif-empty", max_retries=0).models.list()
    finally:
        gw.close()
    out = tmp_path / "t.atif"
    # Token backends store ids, not text: the bundled model's tokenizer decodes the messages.
    result = envhub("export", "--db", f"sqlite:///{tmp_path}/pool.db", "--format", "atif",
                    "--out", str(out), "--tokenizer", "bundled")
    assert result.returncode == 0, result.stderr
    docs = [json.loads(line) for line in out.read_text().splitlines()]
    assert [d["session_id"] for d in docs] == ["atif-a"]
    check_atif(docs[0])
    steps = docs[0]["steps"]
    assert steps[0]["tool_calls"][0]["function_name"] == "calc"
    assert steps[0]["tool_calls"][0]["arguments"] == {"expr": "2*3"}
    assert "tool_calls" not in steps[1] and steps[1]["extra"]["signals"], steps[1]
    assert '"expr": 1+' in steps[1]["message"]
    assert steps[-1]["message"] == "It is 6." and "tool_calls" not in steps[-1]
    assert all(len(s["metrics"]["logprobs"]) == len(s["metrics"]["completion_token_ids"])
               for s in steps)


def test_atif_export_bad_input_exits_2(tmp_path: Path) -> None:
    result = envhub("export", "--format", "atif", "--out", str(tmp_path / "t.atif"))
    assert result.returncode == 2 and "--db" in result.stderr, result.stderr
    (tmp_path / "pool.db").touch()
    result = envhub("export", "--format", "atif", "--out", str(tmp_path / "t.atif"),
                    "--db", f"sqlite:///{tmp_path}/pool.db", "--tokenizer", str(tmp_path))
    assert result.returncode == 2 and "--tokenizer" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t.atif").exists()
