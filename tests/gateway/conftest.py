"""Gateway fixtures: a real gateway on loopback with the bundled tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
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
