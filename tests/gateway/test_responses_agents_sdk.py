"""The OpenAI Agents SDK (`openai-agents`), unchanged, with its default model (the Responses
API model) running a tool-using agent against the gateway: every model call is a recorded
turn, and the turns are token-exact."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

agents = pytest.importorskip("agents")  # the dev extra installs it

from agents import Agent, ModelSettings, RunHooks, Runner, function_tool  # noqa: E402
from agents.models import get_default_model  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from tests.gateway.conftest import scripted, start, tool_call_text  # noqa: E402
from tests.support import trajectory_json as trajectory  # noqa: E402

agents.set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI


class CountCalls(RunHooks):
    def __init__(self) -> None:
        self.calls = 0

    async def on_llm_end(self, context: Any, agent: Any, response: Any) -> None:
        self.calls += 1


def _agent(url: str, key: str, used: list[str], settings: ModelSettings | None = None
           ) -> Agent:
    @function_tool
    def calc(expr: str) -> str:
        """Evaluate an arithmetic expression."""
        used.append(expr)
        return str(eval(expr, {"__builtins__": {}}))  # the scripted model sends 1+1 and 2*3

    # the SDK's default provider and default model name, only pointed at the gateway
    agents.set_default_openai_client(AsyncOpenAI(base_url=f"{url}/v1", api_key=key,
                                                 max_retries=0), use_for_tracing=False)
    return Agent(name="calculator", instructions="Use the calculator.", tools=[calc],
                 model_settings=settings or ModelSettings())


def _check_token_exact(traj: dict[str, Any]) -> None:
    turns = traj["turns"]
    assert len(traj["segments"]) == 1 and traj["cm_actions"] == []
    for prev, turn in zip(turns, turns[1:], strict=False):
        assert turn["prompt_ids"] == (prev["prompt_ids"] + prev["completion_ids"]
                                      + turn["prompt_delta_ids"])


@pytest.mark.parametrize("streamed", [False, True])
def test_agent_tool_loop_is_recorded_token_exact(tmp_path: Path, renderer, streamed: bool):
    backend = scripted(renderer, [tool_call_text("1+1"), tool_call_text("2*3"),
                                  "The answer is 6."])
    gw = start(tmp_path, backend)
    try:
        used: list[str] = []
        agent = _agent(gw.url, "sdk-run", used)
        hooks = CountCalls()

        async def run() -> Any:
            if not streamed:
                return await Runner.run(agent, "What is (1+1)*3?", hooks=hooks)
            result = Runner.run_streamed(agent, "What is (1+1)*3?", hooks=hooks)
            async for _ in result.stream_events():
                pass
            return result

        result = asyncio.run(run())
        traj = trajectory(gw, "sdk-run")
        # the calls went through the Responses API: each is a stored response
        stored = [httpx.get(f"{gw.url}/v1/responses/{r.response_id}",
                            headers={"authorization": "Bearer sdk-run"})
                  for r in result.raw_responses]
    finally:
        gw.close()
    assert agent.model is None  # the SDK's default model (OpenAIResponsesModel)
    assert all(r.status_code == 200 for r in stored)
    assert used == ["1+1", "2*3"] and result.final_output == "The answer is 6."
    assert hooks.calls == len(result.raw_responses) == len(traj["turns"]) == 3
    _check_token_exact(traj)
    assert [ids for _, ids in backend.received] == [t["prompt_ids"] for t in traj["turns"]]
    assert {t["requested_model"] for t in traj["turns"]} == {get_default_model()}


@pytest.mark.slow
def test_agent_with_the_bundled_model(tmp_path: Path):
    pytest.importorskip("torch")
    gw = start(tmp_path, device="cpu")  # the default backend: the embedded engine
    try:
        used: list[str] = []
        agent = _agent(gw.url, "sdk-tiny", used, ModelSettings(max_tokens=24))
        hooks = CountCalls()
        try:
            asyncio.run(Runner.run(agent, "What is 2+2?", hooks=hooks, max_turns=3))
        except agents.MaxTurnsExceeded:
            pass  # a tiny random model may keep calling tools: the calls are still recorded
        traj = trajectory(gw, "sdk-tiny")
    finally:
        gw.close()
    assert hooks.calls == len(traj["turns"]) >= 1
    _check_token_exact(traj)
    assert all(lp <= 0 for t in traj["turns"] for lp in t["completion_logprobs"])
