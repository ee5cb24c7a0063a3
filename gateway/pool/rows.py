"""The rows the gateway writes into the pool, built in one place beside the schema (packing
token arrays, JSON columns, timestamps), so writers pass typed values, not column dicts."""

from __future__ import annotations

import time
from typing import Any

import orjson

from envhub.gateway.pool import schema as t
from envhub.gateway.pool.store import WriteOp, op_event, op_insert
from envhub.sdk.types import ToolCall


def session_insert(session_id: str, key_hash: str, *, group_id: str | None,
                   task_id: str | None, env: str | None, sample_index: int,
                   metadata: dict[str, Any] | None) -> WriteOp:
    """A new open session."""
    return op_insert("sessions", {
        "id": session_id, "key_hash": key_hash, "group_id": group_id, "task_id": task_id,
        "env": env, "sample_index": sample_index, "status": "open", "created_at": time.time(),
        "metadata": orjson.dumps(metadata or {}).decode()})


def turn_insert(session_id: str, *, seq: int, segment: int, parent_seq: int | None,
                prompt_delta: list[int], completion: list[int], logprobs: list[float],
                weight_version: int, finish_reason: str, tool_calls: list[ToolCall],
                msg_hashes: list[bytes], response_hash: bytes, tools_hash: bytes,
                latency_ms: float, instance: str, trainable: bool,
                completion_text: str | None) -> WriteOp:
    """One model call. `prompt_delta`: ids appended since the parent turn (the whole prompt
    on a segment's first turn); `logprobs[i]` is the logprob of `completion[i]`."""
    assert len(completion) == len(logprobs), (
        f"turn {seq}: {len(completion)} completion ids vs {len(logprobs)} logprobs")
    calls = orjson.dumps([{"id": c.id, "name": c.name, "arguments": c.arguments}
                          for c in tool_calls]).decode() if tool_calls else None
    return op_insert("turns", {
        "session_id": session_id, "seq": seq, "segment": segment, "parent_seq": parent_seq,
        "prompt_delta": t.pack_ids(prompt_delta), "completion": t.pack_ids(completion),
        "logprobs": t.pack_floats(logprobs), "weight_version": weight_version,
        "finish_reason": finish_reason, "tool_calls": calls,
        "msg_hashes": b"".join(msg_hashes), "response_hash": response_hash,
        "tools_hash": tools_hash, "latency_ms": latency_ms, "instance": instance,
        "trainable": trainable, "completion_text": completion_text, "created_at": time.time()})


def turn_info(session_id: str, seq: int, *, requested_model: str | None = None,
              forwards: int | None = None, parent_chain: int | None = None) -> WriteOp:
    """Facts about a turn kept beside it (schema.turn_info): the model name the client asked
    for (before the alias table mapped it to a served model), and the engine's forward passes
    for the completion (fewer than its tokens when speculative decoding accepted drafts), and for
    the first turn of a side chain the chain it copied (gateway/history.py, rule 1)."""
    body: dict[str, Any] = {"seq": seq}
    if requested_model is not None:
        body["requested_model"] = requested_model
    if forwards is not None:
        body["forwards"] = forwards
    if parent_chain is not None:
        body["parent_chain"] = parent_chain
    return op_event("turn_info", session_id, body)


def response_insert(response_id: str, session_id: str, *, previous_id: str | None,
                    body: dict[str, Any], input_items: list[dict[str, Any]]) -> WriteOp:
    """A stored Responses API object (schema.responses): its body and the input items after
    its `previous_id` link."""
    return op_insert("responses", {
        "id": response_id, "session_id": session_id, "previous_id": previous_id,
        "body": orjson.dumps(body).decode(), "input": orjson.dumps(input_items).decode(),
        "deleted": False, "created_at": time.time()})
