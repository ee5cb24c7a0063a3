"""A real gateway on loopback for runtime tests, answering from a script (ScriptedBackend:
real tokenizer, real rendering and tool-call parsing, scripted completion texts)."""

from __future__ import annotations

from pathlib import Path

from envhub.gateway.backends.scripted import ScriptedBackend
from envhub.gateway.server import GatewayHandle
from tests.support import bundled_renderer as renderer
from tests.support import gateway_in_thread, scripted_backend, tool_call

__all__ = ["ADMIN_KEY", "FIXTURES", "renderer", "start_gateway", "tool_call"]
ADMIN_KEY = "test-admin-key"
FIXTURES = Path(__file__).resolve().parent


def start_gateway(tmp_path: Path, script: list[str]) -> tuple[GatewayHandle, ScriptedBackend]:
    backend = scripted_backend(script)
    return gateway_in_thread(tmp_path, backend, admin_key=ADMIN_KEY), backend
