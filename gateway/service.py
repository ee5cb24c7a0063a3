"""One model call of a session, independent of the wire API (OpenAI, Anthropic).

plan (extend / fork / new) → prompt ids → engine → parse tool calls → record → answer.
The turn is committed to the pool before the caller gets the answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from envhub.gateway.backends.base import Backend, GenerateRequest, GenerateResult, SamplingParams
from envhub.gateway.errors import (
    BackendUnavailable,
    BadRequest,
    Conflict,
    GatewayError,
    engine_unavailable,
    internal_error,
)
from envhub.gateway.history import History, Plan, TurnState
from envhub.gateway.metrics import Metrics
from envhub.gateway.pool import schema as t
from envhub.gateway.pool.leases import LeaseLost, op_guard
from envhub.gateway.pool.rows import turn_info, turn_insert
from envhub.gateway.pool.store import Store, WriteOp, op_event
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.render.messages import message_hash, tools_hash
from envhub.gateway.render.toolcalls import ParsedCompletion
from envhub.gateway.sessions import LiveSession, forget_history
from envhub.gateway.strict import StrictArguments, strict_arguments
from envhub.sdk.types import CMAction, Signal, ToolCall

_ids = random.Random(int.from_bytes(os.urandom(16), "big"))


def response_id() -> str:
    """A unique, non-secret id for responses and tool calls (os.urandom per call is slow on
    some VMs; session keys still come from `secrets`)."""
    return f"{_ids.getrandbits(96):024x}"


_LEASE_ATTEMPTS = 3  # a session taken by another process this often in one call: give up
Message = dict[str, Any]  # a JSON chat message (raw from the request, or normalised)
HistoryLoader = Callable[[LiveSession], Awaitable[History]]  # Sessions.history


@dataclass
class ChatCall:
    """`messages` are normalised dicts (render/messages.py), or — when `normalize` is given —
    the raw request messages, normalised lazily (only those not seen before in the session)."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None
    params: SamplingParams
    n: int = 1
    normalize: Callable[[Message, int], Message] | None = None
    requested_model: str | None = None  # the name the client asked for, recorded per turn
    new_chain: bool = False  # the client says it starts a conversation (X-Envhub-Chain: new)
    tool_choice_none: bool = False  # tools declared but tool_choice none: no call may come back
    # functions whose calls must match their schema (→ True: the request said strict itself)
    strict: dict[str, bool] = field(default_factory=dict)

    def prepared(self, live: LiveSession) -> tuple[list[bytes], Callable[[int], Message]]:
        """Message hashes, and an accessor for the normalised message i."""
        if self.normalize is None:
            return [message_hash(m) for m in self.messages], self.messages.__getitem__
        hashes, fresh = live.memo.hashes(self.messages)
        norm = self.normalize

        def get(i: int) -> Message:
            if i not in fresh:
                fresh[i] = norm(self.messages[i], i)
            return fresh[i]

        return hashes, get


CHAIN_HEADER = "x-envhub-chain"


def new_chain(headers: Mapping[str, str]) -> bool:
    """`X-Envhub-Chain: new`: the request starts a conversation of its own, whatever it shares
    with the session's (for harnesses that run one agent several times on a key; see
    gateway/history.py). 400 for any other value."""
    value = headers.get(CHAIN_HEADER)
    if value is None:
        return False
    if value.strip().lower() != "new":
        raise BadRequest(f"{CHAIN_HEADER}: {value[:40]!r} is not understood; send 'new' to start "
                         "a conversation of its own, or leave the header out")
    return True


@dataclass
class Choice:
    seq: int
    result: GenerateResult
    parsed: ParsedCompletion
    tool_calls: list[dict[str, Any]]  # OpenAI shape, with ids
    finish_reason: str  # OpenAI's: stop | length | tool_calls


@dataclass
class ChatAnswer:
    choices: list[Choice]
    prompt_tokens: int
    backend_ms: float = 0.0  # time spent waiting for the engine
    render_ms: float = 0.0  # plan (match against the history) + render of the prompt
    id: str = field(default_factory=lambda: f"chatcmpl-{response_id()}")
    created: int = field(default_factory=lambda: int(time.time()))


class ChatService:
    def __init__(self, renderer: ChatRenderer, backend: Backend, store: Store, metrics: Metrics,
                 max_model_len: int, text_backend: bool = False):
        self.renderer = renderer
        self.backend = backend
        self.store = store
        self.metrics = metrics
        self.max_model_len = max_model_len
        self.text_backend = text_backend  # hosted models take messages, not ids

    async def _leased(self, live: LiveSession, history_loader: HistoryLoader,
                      attempt: Callable[[History], Awaitable[ChatAnswer]]) -> ChatAnswer:
        """Run `attempt` on the session's history; when another gateway process took the session
        meanwhile (pool/leases.py) nothing was recorded: reload the history and run it again."""
        for _ in range(_LEASE_ATTEMPTS):
            if live.status != "open":
                raise Conflict(f"session {live.id!r} is {live.status}; open a new session")
            history = await history_loader(live)
            try:
                return await attempt(history)
            except LeaseLost:
                self.metrics.lease_lost.inc()
                await forget_history(self.store, live, history)
        raise BackendUnavailable(f"session {live.id!r} kept moving between gateway processes "
                                 "sharing this pool; retry (a proxy in front should hash the "
                                 "session key to one process)")

    async def chat(self, live: LiveSession, history_loader: HistoryLoader,
                   call: ChatCall) -> ChatAnswer:
        return await self._leased(live, history_loader,
                                  lambda history: self._chat(live, history, call))

    async def _chat(self, live: LiveSession, history: History, call: ChatCall) -> ChatAnswer:
        t0 = time.perf_counter()
        async with live.lock:
            hashes, message = call.prepared(live)
            tools_key = tools_hash(call.tools)
            strict = strict_arguments(call.tools, call.strict, tools_key)  # 400 before the plan
            plan = history.plan(hashes, tools_key, lambda i: message(i)["role"],
                                new_chain=call.new_chain,
                                text=lambda i: message_text(message(i)))
            try:
                n_messages = len(hashes)
                prompt, delta = self._prompt(plan, message, n_messages, call.tools)
                budget = self.max_model_len - len(prompt)
                if budget < 1:
                    raise BadRequest(f"the prompt is {len(prompt)} tokens; this model's limit "
                                     f"is {self.max_model_len}: shorten the conversation",
                                     code="context_length_exceeded")
                params = replace(call.params, max_tokens=min(call.params.max_tokens, budget))
                messages = ([message(i) for i in range(n_messages)] if self.text_backend
                            else None)
            except BaseException:
                history.release(None, plan.declared)  # nothing allocated yet
                raise
            # A retry reuses the earlier turn's parent and messages.
            parent = plan.parent
            if plan.kind == "retry":
                assert parent is not None, plan
                parent = parent.parent
            appended_hashes = plan.appended_hashes
            request_key = history.request_key(parent, tools_key, appended_hashes)
            extends = plan.parent if plan.kind == "extend" else None
            seqs, segments = history.allocate(call.n, extends)
        render_ms = (time.perf_counter() - t0) * 1000
        self.metrics.render_ms.observe(render_ms)
        answer = await self._execute(live, history, _Prepared(
            prompt=prompt, delta=delta, parent=parent, seqs=seqs, segments=segments,
            appended_hashes=appended_hashes, tools_key=tools_key, request_key=request_key,
            action=plan.action, new_segment=plan.new_segment, params=params,
            n_messages=n_messages, side_of=plan.side_of,
            tool_names={tool["function"]["name"] for tool in call.tools or []},
            extends=extends, declared=plan.declared, messages=messages,
            tools=call.tools, requested_model=call.requested_model,
            tool_choice_none=call.tool_choice_none, strict=strict), t0)
        answer.render_ms = render_ms
        return answer

    def _prompt(self, plan: Plan, message: Callable[[int], Message], n_messages: int,
                tools: list[dict[str, Any]] | None) -> tuple[list[int], list[int]]:
        """(prompt ids, the delta to store) for a planned request."""
        if plan.kind in ("extend", "fork"):
            assert plan.parent is not None, plan
            appended = [message(i) for i in range(plan.appended_from, n_messages)]
            cont = self.renderer.render_continuation(plan.parent.completion_ids, appended,
                                                     tools).ids
            prompt = plan.parent.full_ids() + cont
            return prompt, (cont if plan.kind == "extend" else prompt)
        if plan.kind == "retry":
            assert plan.parent is not None, plan
            prompt = plan.parent.prompt_ids()
            return prompt, prompt
        prompt = self.renderer.render_prompt([message(i) for i in range(n_messages)], tools).ids
        return prompt, prompt

    async def preview(self, live: LiveSession, history_loader: HistoryLoader,
                      call: ChatCall) -> int:
        """The prompt length a call would send now; records nothing, changes nothing. A call
        `chat` refuses (a strict schema strict mode does not support) is refused here too."""
        history = await history_loader(live)
        async with live.lock:
            hashes, message = call.prepared(live)
            tools_key = tools_hash(call.tools)
            strict_arguments(call.tools, call.strict, tools_key)
            plan = history.plan(hashes, tools_key, lambda i: message(i)["role"],
                                consume_declared=False, new_chain=call.new_chain,
                                text=lambda i: message_text(message(i)))
            return len(self._prompt(plan, message, len(hashes), call.tools)[0])

    async def complete(self, live: LiveSession, history_loader: HistoryLoader, prompt: list[int],
                       params: SamplingParams, n: int,
                       requested_model: str | None = None) -> ChatAnswer:
        """A raw token/text completion: extends the latest turn when its ids prefix the prompt,
        else starts a new segment (no chat messages, so no context-action classification)."""
        return await self._leased(live, history_loader, lambda history: self._complete(
            live, history, prompt, params, n, requested_model))

    async def _complete(self, live: LiveSession, history: History, prompt: list[int],
                        params: SamplingParams, n: int,
                        requested_model: str | None) -> ChatAnswer:
        t0 = time.perf_counter()
        async with live.lock:
            tip, parent = history.latest, None
            if tip is not None and not tip.extended:
                full = tip.full_ids()
                if len(prompt) > len(full) and prompt[:len(full)] == full:
                    parent = tip
            budget = self.max_model_len - len(prompt)
            if budget < 1:
                raise BadRequest(f"the prompt is {len(prompt)} tokens; this model's limit is "
                                 f"{self.max_model_len}", code="context_length_exceeded")
            seqs, segments = history.allocate(n, parent)
        delta = prompt[len(parent.full_ids()):] if parent is not None else prompt
        return await self._execute(live, history, _Prepared(
            prompt=prompt, delta=delta, parent=parent, seqs=seqs, segments=segments,
            appended_hashes=[], tools_key=_RAW, request_key=_raw_key(prompt), action=None,
            new_segment=parent is None, params=replace(params, max_tokens=min(
                params.max_tokens, budget)), n_messages=0, tool_names=set(), extends=parent,
            raw=True, requested_model=requested_model), t0)

    async def _execute(self, live: LiveSession, history: History, p: _Prepared,
                       t0: float) -> ChatAnswer:
        tb = time.perf_counter()
        calls = [self.backend.generate(GenerateRequest(
            prompt_ids=p.prompt,
            params=p.params if p.params.seed is None or i == 0 else replace(
                p.params, seed=p.params.seed + i),
            request_id=f"{live.id}-{seq}", session_id=live.id, group_id=live.group_id,
            messages=p.messages,
            tools=p.tools if p.messages is not None else None))
            for i, seq in enumerate(p.seqs)]
        try:
            results = [await calls[0]] if len(calls) == 1 else await asyncio.gather(*calls)
        except BackendUnavailable as e:  # instance names and upstream text stay in the log
            history.release(p.extends, p.declared)
            self.metrics.backend_errors.inc()
            raise engine_unavailable(e) from e
        except (GatewayError, asyncio.CancelledError):  # cancelled: the agent hung up
            history.release(p.extends, p.declared)
            raise
        except Exception as e:
            history.release(p.extends, p.declared)
            self.metrics.backend_errors.inc()
            # the cause stays in the log (it may name hosts and paths); the answer names its id
            error_id = internal_error(e, "the inference engine").error_id
            raise BackendUnavailable(f"the inference engine failed (error id {error_id}, its "
                                     "cause is in the gateway's log); retry") from e

        backend_ms = (time.perf_counter() - tb) * 1000
        choices: list[Choice] = []
        # first: fails the transaction when another process took the session (leases.py)
        ops: list[WriteOp] = [] if history.lease is None else [op_guard(live.id, history.lease)]
        states: list[TurnState] = []
        actions: list[CMAction | None] = []
        latency_ms = (time.perf_counter() - t0) * 1000
        self.metrics.latency_ms.observe(latency_ms)
        try:  # nothing recorded: the history's allocation goes back (as on every failure)
            for i, (seq, seg, res) in enumerate(zip(p.seqs, p.segments, results, strict=True)):
                choice, signals = self._choice(seq, res, p)
                choices.append(choice)
                state = TurnState(seq=seq, segment=seg, parent=p.parent,
                                  delta_ids=p.delta if i == 0 else p.prompt,
                                  completion_ids=res.completion_ids,
                                  appended_hashes=p.appended_hashes,
                                  response_hash=_RAW if p.raw else _response_hash(choice),
                                  tools_key=p.tools_key,
                                  response_text=choice.parsed.content or res.text or "")
                states.append(state)
                ops.append(turn_insert(
                    live.id, seq=seq, segment=seg,
                    parent_seq=p.parent.seq if p.parent is not None else None,
                    prompt_delta=state.delta_ids, completion=res.completion_ids,
                    logprobs=res.logprobs, weight_version=res.weight_version,
                    # what the client was told (a parsed tool call: tool_calls, as OpenAI
                    # says; the engine itself stopped at its stop token)
                    finish_reason=choice.finish_reason,
                    tool_calls=[ToolCall(id=c["id"], name=c["function"]["name"],
                                         arguments=c["function"]["arguments"])
                                for c in choice.tool_calls],
                    msg_hashes=p.appended_hashes, response_hash=state.response_hash,
                    tools_hash=p.tools_key, latency_ms=latency_ms, instance=res.instance,
                    trainable=res.trainable and live.trainable, completion_text=res.text))
                action = p.action if i == 0 else CMAction(
                    kind="fork", from_seq=p.seqs[0],
                    info={"reason": f"choice {i} of n={len(p.seqs)}"})
                actions.append(action)
                if action is not None:
                    action = action.model_copy(update={
                        "seq": seq, "segment": seg if (i > 0 or p.new_segment) else None,
                        "tokens_after": len(p.prompt)})
                    ops.append(op_event("cm_actions", live.id, action.model_dump()))
                    self.metrics.cm_actions.labels(action.kind).inc()
                for sig in signals:
                    ops.append(op_event("signals", live.id, sig.model_dump()))
                side_of = p.side_of if i == 0 else None
                if (p.requested_model is not None or res.forwards is not None
                        or side_of is not None):
                    ops.append(turn_info(live.id, seq, requested_model=p.requested_model,
                                         forwards=res.forwards, parent_chain=side_of))
        except BaseException:
            history.release(p.extends, p.declared)
            raise
        try:
            await self.store.write(*ops)
        except Exception:
            history.release(p.extends, p.declared)
            raise
        async with live.lock:
            for i, (state, action) in enumerate(zip(states, actions, strict=True)):
                history.add(state, p.request_key, p.n_messages, action,
                            p.side_of if i == 0 else None)
        self.metrics.turns.inc(len(states))
        self.metrics.completion_tokens.inc(sum(len(r.completion_ids) for r in results))
        counted = [r for r in results if r.forwards]
        self.metrics.forwards.inc(sum(r.forwards or 0 for r in counted))
        self.metrics.forward_tokens.inc(sum(len(r.completion_ids) for r in counted))
        self.metrics.prompt_tokens.inc(len(p.prompt) * len(results))
        return ChatAnswer(choices=choices, prompt_tokens=len(p.prompt), backend_ms=backend_ms)

    def _choice(self, seq: int, res: GenerateResult, p: _Prepared
                ) -> tuple[Choice, list[Signal]]:
        if p.raw:
            parsed = ParsedCompletion(content=self.renderer.decode(res.completion_ids, True))
            return Choice(seq, res, parsed, [], res.finish_reason), []
        if res.text is not None and not res.completion_ids:  # text-only backend
            text = res.text
        else:
            text = self.renderer.completion_text(res.completion_ids)
        parsed = self.renderer.parse_text(text)
        signals = []
        if parsed.malformed:
            signals.append(Signal(name="malformed_tool_call", seq=seq,
                                  info={"error": parsed.malformed}))
        undeclared = sorted({c["name"] for c in parsed.tool_calls} - p.tool_names)
        if undeclared:
            # OpenAI never returns a call to a function the request did not offer: the whole
            # answer goes back as text (echoed, it still hashes as recorded: _response_hash).
            signals.append(Signal(name="undeclared_tool", seq=seq,
                                  info={"tools": undeclared, "why": _why_undeclared(p)}))
            parsed = ParsedCompletion(content=text)
        elif p.strict is not None:
            # a strict function's call whose arguments break its schema (tool_choice auto is
            # sampled without a grammar): never a call the client could dispatch
            broken = [(c["name"], err) for c in parsed.tool_calls
                      if (err := p.strict.error(c["name"], c["arguments"])) is not None]
            if broken:
                signals.append(Signal(name="invalid_tool_arguments", seq=seq, info={
                    "tool": broken[0][0], "error": broken[0][1],
                    "why": "the function is strict: its arguments must match its schema"}))
                parsed = ParsedCompletion(content=text)
        calls = [{"id": f"call_{response_id()}", "type": "function",
                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                 for c in parsed.tool_calls]
        finish = "tool_calls" if calls else res.finish_reason
        return Choice(seq, res, parsed, calls, finish), signals


_RAW = b"\0" * 8  # raw completions have no messages or tools to hash


def _raw_key(prompt: list[int]) -> bytes:
    return hashlib.blake2b(t.pack_ids(prompt), digest_size=8).digest()


def _why_undeclared(p: _Prepared) -> str:
    if p.tool_choice_none:
        return "tool_choice is none: the request allowed no tool call"
    if not p.tool_names:
        return "the request declared no tools"
    return f"not among the request's tools ({', '.join(sorted(p.tool_names))})"


def message_text(message: Any) -> str:
    """The text of a request message: its content string, or its text parts joined."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text") or "") for part in content
                         if isinstance(part, dict))
    return ""


def _response_hash(choice: Choice) -> bytes:
    """Hash of the assistant message as the agent will echo it back (see messages.py)."""
    response: dict[str, Any] = {"role": "assistant", "content": choice.parsed.content or ""}
    if choice.tool_calls:
        response["tool_calls"] = [
            {"function": {"name": c["function"]["name"],
                          "arguments": orjson.loads(c["function"]["arguments"])}}
            for c in choice.tool_calls]
    return message_hash(response)


@dataclass
class _Prepared:
    prompt: list[int]
    delta: list[int]
    parent: TurnState | None
    seqs: list[int]
    segments: list[int]
    appended_hashes: list[bytes]
    tools_key: bytes
    request_key: bytes
    action: CMAction | None
    new_segment: bool
    params: SamplingParams
    n_messages: int
    tool_names: set[str]
    extends: TurnState | None  # the segment tip this call continues; released on failure
    declared: CMAction | None = None  # the agent's declaration it took; back on failure
    raw: bool = False
    messages: list[Message] | None = None  # for text-only backends
    tools: list[dict[str, Any]] | None = None
    requested_model: str | None = None
    tool_choice_none: bool = False
    strict: StrictArguments | None = None
    side_of: int | None = None  # the first turn starts a side chain of this chain
