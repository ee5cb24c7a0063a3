"""A real gateway on loopback for runtime tests, answering from a script (ScriptedBackend:
real tokenizer, real rendering and tool-call parsing, scripted completion texts)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.config import BUNDLED_MODEL, GatewayConfig
from envhub.gateway.render.chat_template import ChatRenderer
from envhub.gateway.server import GatewayHandle, run_in_thread

ADMIN_KEY = "test-admin-key"
FIXTURES = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def renderer() -> ChatRenderer:
    return ChatRenderer.from_pretrained(BUNDLED_MODEL)


def tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A completion text holding one Hermes-format tool call (the bundled template's format)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def start_gateway(tmp_path: Path, script: list[str]) -> tuple[GatewayHandle, ScriptedBackend]:
    r = renderer()
    backend = ScriptedBackend(r.encode, script, r.stop_token_ids[0])
    handle = run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{tmp_path}/pool.db",
                                         admin_key=ADMIN_KEY), backend=backend)
    return handle, backend
