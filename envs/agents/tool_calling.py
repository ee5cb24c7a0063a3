"""The built-in tool-calling agent: a chat loop over its gateway session's OpenAI client.

Per turn: fit the context (declare any CM action), call the model, run each tool call, report
process signals the gateway cannot see (tool_error, language_mixing) against the turn that
caused them (the gateway records malformed_tool_call and undeclared_tool itself).
Stops on submit, on a reply without tool calls when there is no submit tool, or at the turn,
token or time limit. Gateway failures are infrastructure (EnvFailure); a request the gateway
rejects as bad is the agent's own error (AgentError).

With `tool_choice="required"` (`--agent tool:required`) every call asks the gateway to constrain
the reply to a call of an offered tool with valid arguments: for a small model in an
environment where every step is a tool call (the bundled model in `search`). The engine must
support constrained sampling (the local, vllm or sglang backends do; scripted ones refuse).
For evaluation and demos: on the local engine the recorded logprobs of constrained turns do
not match the trainer's recomputation (`trainer/kl/rollout_train_k1` of 5-13 on `search`, 0
unconstrained), so importance ratios of such rollouts are off.

With a `seed`, each call asks for a sampling seed drawn from it, the task, the sample's index
in its group and the turn: the same weights then give the same rollout (up to the engine's
batch numerics), and two weight versions are sampled with the same random numbers (common
random numbers: a held-out evaluation before and after training differs by what the weights
changed, not by a fresh draw of noise).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any, Literal

from envhub.envs.agents.base import AgentContext, AgentResult
from envhub.envs.agents.context import ContextStrategy, estimate_tokens
from envhub.envs.agents.toolbox import Toolbox
from envhub.envs.environment import EnvFailure
from envhub.envs.errors import AgentError
from envhub.envs.rewards import mixes_languages

SYSTEM_PROMPT = (
    "You are an autonomous agent. Solve the task by calling the tools you are given, one step "
    "at a time. Read each tool result before the next step. When the task is done, call the "
    "submit tool."
)
NUDGE = "Continue by calling one of the tools; call submit when you are done."


class ToolCallingAgent:
    name = "tool"

    def __init__(self, context: str = "drop", keep_last: int = 2,
                 temperature: float = 1.0, seed: int | None = None,
                 tool_choice: Literal["auto", "required"] = "auto") -> None:
        self.strategy = ContextStrategy(context, keep_last)  # type: ignore[arg-type]
        self.temperature = temperature
        self.seed = seed
        self.tool_choice = tool_choice

    async def run(self, ctx: AgentContext) -> AgentResult:
        # No client retries: the gateway's router owns retries (STYLE: retry in one place), and
        # a retried call would be recorded as a second turn. Closed on the way out: a client
        # left to the garbage collector closes its connections on whatever event loop runs
        # then, which fails once the rollout's own loop is gone.
        async with ctx.session.openai(max_retries=0) as client:
            return await self._run(ctx, client)

    async def _run(self, ctx: AgentContext, client: Any) -> AgentResult:
        toolbox = Toolbox(ctx.env, ctx.task, ctx.sandbox, ctx.package_root)
        try:
            # the environment's MCP servers start before the agent's first step: one that
            # cannot start failed on its own (EnvFailure), nothing the agent did
            await toolbox.start()
            return await self._loop(ctx, client, toolbox)
        finally:
            await toolbox.aclose()  # its servers stop with the agent phase

    async def _loop(self, ctx: AgentContext, client: Any, toolbox: Toolbox) -> AgentResult:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": ctx.task.instruction},
        ]
        limits, started = ctx.limits, time.monotonic()
        used_tokens, known_tokens, known_len, seq = 0, 0, 0, 0
        info: dict[str, Any] = {"cm_actions": 0, "signals": 0}
        while True:
            if seq >= limits.max_turns:
                return AgentResult("max_turns", seq, info)
            if used_tokens >= limits.max_tokens:
                return AgentResult("max_tokens", seq, info)
            remaining_s = limits.time_limit_s - (time.monotonic() - started)
            if remaining_s <= 0:
                return AgentResult("time_limit", seq, info)
            tokens = estimate_tokens(messages, known_tokens, known_len)
            messages, action = self.strategy.fit(messages, tokens, limits.context_budget)
            if action is not None:
                info["cm_actions"] += 1
                known_tokens, known_len = 0, 0  # the reported prefix no longer applies
                await ctx.session.context_action(
                    action.kind, removed=action.removed, added=action.added,
                    tokens_before=action.tokens_before, tokens_after=action.tokens_after)
            max_new = max(1, min(limits.max_tokens_per_turn, limits.max_tokens - used_tokens))
            reply = await self._complete(client, ctx, messages, toolbox, max_new, remaining_s,
                                         self._turn_seed(ctx, seq))
            if reply is None:  # the call outlived the agent's time budget
                return AgentResult("time_limit", seq, info)
            message = reply.choices[0].message
            if reply.usage is not None:
                used_tokens += reply.usage.completion_tokens
                known_tokens = reply.usage.prompt_tokens + reply.usage.completion_tokens
            assistant = _assistant_message(message)
            messages.append(assistant)
            known_len = len(messages)
            if message.content and mixes_languages(message.content):
                await self._signal(ctx, info, "language_mixing", seq)
            calls = list(message.tool_calls or [])
            this_seq, seq = seq, seq + 1
            if not calls:
                if "submit" not in toolbox.names:
                    return AgentResult("finished", seq, info)
                messages.append({"role": "user", "content": NUDGE})
                continue
            submitted = False
            for call in calls:
                out = await toolbox.call(call.function.name, call.function.arguments or "",
                                         ctx.state)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": out.content})
                # The gateway itself records undeclared_tool (it sees the offered tools), for
                # every kind of agent; only errors it cannot see are reported here.
                if out.is_error and not out.unknown:
                    await self._signal(ctx, info, "tool_error", this_seq,
                                       {"tool": call.function.name})
                submitted = submitted or out.submitted
            if submitted:
                return AgentResult("submitted", seq, info)

    async def _complete(self, client: Any, ctx: AgentContext, messages: list[dict[str, Any]],
                        toolbox: Toolbox, max_new: int, timeout_s: float,
                        seed: int | None) -> Any | None:
        import openai

        try:
            required = self.tool_choice == "required" and toolbox.schemas
            return await client.chat.completions.create(
                model=ctx.model, messages=messages, tools=toolbox.schemas or openai.NOT_GIVEN,
                tool_choice="required" if required else openai.NOT_GIVEN,
                max_tokens=max_new, temperature=self.temperature, timeout=max(1.0, timeout_s),
                seed=openai.NOT_GIVEN if seed is None else seed)
        except openai.APIStatusError as e:
            if e.status_code in (400, 413, 422):
                raise AgentError(f"the gateway rejected the agent's request "
                                 f"({e.status_code}): {e.message}") from None
            raise EnvFailure(f"gateway error {e.status_code}: {e.message}") from None
        except openai.APITimeoutError:
            return None  # timed out at the agent's remaining time: its limit, not the gateway's
        except openai.APIConnectionError as e:
            cause = e.__cause__  # the transport's error says what happened to the connection
            why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
            raise EnvFailure(f"gateway unreachable: {type(e).__name__}: {e}{why}") from None

    def _turn_seed(self, ctx: AgentContext, turn: int) -> int | None:
        if self.seed is None:
            return None
        key = f"{self.seed}:{ctx.task.id}:{ctx.sample}:{turn}".encode()
        return int.from_bytes(hashlib.sha256(key).digest()[:4], "big") >> 1  # 31 bits

    async def _signal(self, ctx: AgentContext, info: dict[str, Any], name: str, seq: int,
                      extra: dict[str, Any] | None = None) -> None:
        info["signals"] += 1
        await ctx.session.signal(name, seq=seq, value=1.0, info=extra or {})


def _assistant_message(message: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.function.name, "arguments": c.function.arguments or ""}}
            for c in message.tool_calls
        ]
    return out
