"""Export to Harbor's ATIF (Agent Trajectory Interchange Format): one ATIF trajectory document
per session, written one per line (JSONL).

Mapping (ATIF field names as in Harbor's `harbor.models.trajectories`):
* a session -> `Trajectory` (`session_id` = `trajectory_id` = the session id; `agent.name` the
  agent the runner recorded in the session metadata, else "envhub");
* a turn (one model call) -> one `Step` with `source: "agent"`, `llm_call_count: 1`: `message`
  the completion text (stored by text-only backends; token backends store ids, decoded with
  the tokenizer given to `envhub export --tokenizer`, else left empty), `tool_calls` as
  parsed by the gateway, and `metrics` with the exact `prompt_token_ids` (the whole prompt
  the engine saw), `completion_token_ids` and the rollout `logprobs` (one per completion
  token; ATIF's own fields for RL data);
* what ATIF has no field for goes under `extra`: per step the weight version, segment,
  finish reason, trainability, the context-management action that started the step's segment
  and the turn's process signals; per trajectory the status (env_failure / agent_error with
  its reason), the reward events and the composite reward.

The pool keeps prompt tokens, not the request messages' text, so user and tool messages are
not separate steps: they are inside each step's `prompt_token_ids`. A session without model
calls (the oracle, an agent that never asked) has no ATIF form (ATIF needs >= 1 step) and is
counted as skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from envhub.gateway.pool.export import trajectories
from envhub.gateway.pool.store import Store
from envhub.sdk.types import Trajectory, Turn

Decode = Callable[[list[int]], str]
SCHEMA_VERSION = "ATIF-v1.7"  # the newest version whose fields we use (llm_call_count, ids)


def _timestamp(epoch: float) -> str | None:
    if not epoch:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat().replace("+00:00", "Z")


def _arguments(text: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """ATIF wants an object; a model's malformed arguments are kept verbatim under extra."""
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return {}, {"arguments_text": text, "arguments_valid_json": False}
    if isinstance(value, dict):
        return value, None
    return {}, {"arguments_text": text, "arguments_valid_json": True}


def tokenizer_decode(model: str) -> Decode:
    """Decode sampled ids with a model folder's tokenizer ('bundled': the bundled model's).
    Raises ValueError (with the fix) when there is no tokenizer to load there."""
    from transformers import AutoTokenizer

    from envhub.gateway.engine.config import BUNDLED_MODEL

    try:
        tokenizer = AutoTokenizer.from_pretrained(BUNDLED_MODEL if model == "bundled" else model)
    except (OSError, ValueError) as e:
        raise ValueError(f"--tokenizer {model}: no tokenizer there ({type(e).__name__}); give "
                         "the folder of the model that served the run, or 'bundled'") from None
    return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True))


def _step(index: int, turn: Turn, traj: Trajectory, decode: Decode | None) -> dict[str, Any]:
    calls = []
    for call in turn.tool_calls:
        arguments, raw = _arguments(call.arguments)
        calls.append({"tool_call_id": call.id, "function_name": call.name,
                      "arguments": arguments, **({"extra": raw} if raw else {})})
    prompt = turn.prompt_ids or turn.prompt_delta_ids
    extra: dict[str, Any] = {
        "seq": turn.seq, "segment": turn.segment, "weight_version": turn.weight_version,
        "finish_reason": turn.finish_reason, "trainable": turn.trainable,
        "latency_ms": turn.latency_ms, "instance": turn.instance,
        "prompt_delta_tokens": len(turn.prompt_delta_ids),
    }
    actions = [a.model_dump(mode="json") for a in traj.cm_actions if a.seq == turn.seq]
    if actions:
        extra["cm_actions"] = actions
    signals = [s.model_dump(mode="json") for s in traj.signals if s.seq == turn.seq]
    if signals:
        extra["signals"] = signals
    step: dict[str, Any] = {
        "step_id": index, "source": "agent",
        "message": turn.completion_text or (decode(turn.completion_ids) if decode else ""),
        "llm_call_count": 1,
        "metrics": {"prompt_tokens": len(prompt), "completion_tokens": len(turn.completion_ids),
                    "prompt_token_ids": prompt, "completion_token_ids": turn.completion_ids,
                    "logprobs": turn.completion_logprobs},
        "extra": extra,
    }
    if turn.requested_model:
        step["model_name"] = turn.requested_model
    if calls:
        step["tool_calls"] = calls
    stamp = _timestamp(turn.created_at)
    if stamp:
        step["timestamp"] = stamp
    return step


def to_atif(traj: Trajectory, version: str = "",
            decode: Decode | None = None) -> dict[str, Any] | None:
    """The ATIF document of one session, or None when it made no model call. Messages are
    the stored text (text-only backends), else `decode(completion ids)`, else empty."""
    turns = sorted(traj.turns, key=lambda t: t.seq)
    if not turns:
        return None
    session = traj.session
    steps = [_step(i, turn, traj, decode) for i, turn in enumerate(turns, 1)]
    agent: dict[str, Any] = {"name": str(session.metadata.get("agent") or "envhub"),
                             "version": version or "unknown"}
    model = next((t.requested_model for t in turns if t.requested_model), None)
    if model:
        agent["model_name"] = model
    return {
        "schema_version": SCHEMA_VERSION, "session_id": session.id,
        "trajectory_id": session.id, "agent": agent, "steps": steps,
        "final_metrics": {
            "total_prompt_tokens": sum(s["metrics"]["prompt_tokens"] for s in steps),
            "total_completion_tokens": sum(s["metrics"]["completion_tokens"] for s in steps),
            "total_steps": len(steps),
            "extra": {"reward": traj.total_reward(),
                      "rewards": [r.model_dump(mode="json") for r in traj.rewards]},
        },
        "extra": {"envhub": {
            "status": traj.status.value, "reason": session.reason,
            "group_id": session.group_id, "task_id": session.task_id, "env": session.env,
            "sample_index": session.sample_index, "segments": len(traj.segments),
            "created_at": _timestamp(session.created_at),
            "closed_at": _timestamp(session.closed_at or 0.0)}},
    }


def export_atif(store: Store, out: Path, group_id: str | None = None,
                status: str | None = None, version: str = "",
                decode: Decode | None = None) -> tuple[int, int]:
    """Write one ATIF document per line to `out`; (written, skipped without model calls)."""
    written = skipped = 0
    tmp = out.with_name(out.name + ".part")  # no half-written file on failure
    try:
        with open(tmp, "wb") as f:
            for traj in trajectories(store, group_id, status):
                doc = to_atif(traj, version, decode)
                if doc is None:
                    skipped += 1
                    continue
                f.write(orjson.dumps(doc) + b"\n")
                written += 1
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
    return written, skipped
