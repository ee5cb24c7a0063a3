"""Gateway fixtures: a real gateway on loopback with the bundled tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.server import GatewayHandle
from tests.support import bundled_renderer, scripted_backend, tool_call
from tests.support import gateway_in_thread as start  # start(tmp_path, backend, **config)

CALC_TOOL = {"type": "function", "function": {
    "name": "calc", "description": "evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                   "required": ["expr"]}}}


def tool_call_text(expr: str) -> str:
    return tool_call("calc", {"expr": expr})


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    return bundled_renderer()


def scripted(renderer: ChatRenderer, script: list[str]) -> ScriptedBackend:
    assert renderer is bundled_renderer()  # the fixture's: scripted_backend encodes with it
    return scripted_backend(script)


@pytest.fixture
def tool_script(renderer: ChatRenderer) -> ScriptedBackend:
    """Two tool calls then a plain answer, cycling."""
    return scripted(renderer, [tool_call_text("1+1"), tool_call_text("2*3"), "The answer is 6."])


@pytest.fixture
def gateway(tmp_path: Path, tool_script: ScriptedBackend) -> Iterator[GatewayHandle]:
    handle = start(tmp_path, tool_script)
    yield handle
    handle.close()


# Anthropic clients of the gateway (test_anthropic_client.py, test_anthropic_errors.py)
CALC = {"name": "calc", "description": "evaluate an arithmetic expression",
        "input_schema": {"type": "object", "properties": {"expr": {"type": "string"}},
                         "required": ["expr"]}}


def client(gw: GatewayHandle, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key=key, max_retries=0)


@pytest.fixture(scope="module")
def bundled_gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayHandle]:
    """A gateway on the bundled model (the embedded engine), one per test module."""
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.engine import BUNDLED_MODEL
    from envhub.gateway.server import run_in_thread

    db = f"sqlite:///{tmp_path_factory.mktemp('bundled')}/pool.db"
    handle = run_in_thread(GatewayConfig(port=0, db=db, backend="local",
                                         model=str(BUNDLED_MODEL), default_max_tokens=48))
    yield handle
    handle.close()


def openai_client(gw: GatewayHandle, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
