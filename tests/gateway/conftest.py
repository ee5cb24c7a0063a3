"""Gateway fixtures: a real gateway on loopback with the bundled tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.config import BUNDLED_MODEL, GatewayConfig
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.server import GatewayHandle, run_in_thread

CALC_TOOL = {"type": "function", "function": {
    "name": "calc", "description": "evaluate an arithmetic expression",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                   "required": ["expr"]}}}


def tool_call_text(expr: str) -> str:
    return '<tool_call>\n{"name": "calc", "arguments": {"expr": "%s"}}\n</tool_call>' % expr


@pytest.fixture(scope="session")
def renderer() -> ChatRenderer:
    return ChatRenderer.from_pretrained(BUNDLED_MODEL)


def scripted(renderer: ChatRenderer, script: list[str]) -> ScriptedBackend:
    return ScriptedBackend(renderer.encode, script, renderer.stop_token_ids[0])


def start(tmp_path: Path, backend, **config) -> GatewayHandle:
    return run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{tmp_path}/pool.db", **config),
                         backend=backend)


@pytest.fixture
def tool_script(renderer: ChatRenderer) -> ScriptedBackend:
    """Two tool calls then a plain answer, cycling."""
    return scripted(renderer, [tool_call_text("1+1"), tool_call_text("2*3"), "The answer is 6."])


@pytest.fixture
def gateway(tmp_path: Path, tool_script: ScriptedBackend) -> Iterator[GatewayHandle]:
    handle = start(tmp_path, tool_script)
    yield handle
    handle.close()
