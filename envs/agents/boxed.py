"""A command-line agent run inside its rollout's sandbox (the default for command lines), as
Harbor's installed agents are.

The agent's programs come from its `--agent-install` bundle (install.py): baked into a cached
layer on the environment's image (docker) or bound read-only (local). Its only way out is its
own gateway session: the runner binds the rollout's channel folder (channel.py) at
CHANNEL_DIR, where the forwarder listens on 127.0.0.1:PORT and pipes to the host end. Inside:
  OPENAI_BASE_URL=http://127.0.0.1:PORT/v1  OPENAI_API_KEY=<placeholder, worthless outside>
  ANTHROPIC_BASE_URL=http://127.0.0.1:PORT  ANTHROPIC_API_KEY=<placeholder>
  ENVHUB_SESSION_ID, ENVHUB_TASK_ID, ENVHUB_TASK_FILE, ENVHUB_MODEL, ENVHUB_SANDBOX_KIND.
When the environment has tools, the same forwarder also serves them over MCP (envs/mcp/server.py):
  ENVHUB_MCP_URL=http://127.0.0.1:PORT/mcp  (Streamable HTTP, server name `envhub`)
  ENVHUB_MCP_CONFIG=CHANNEL_DIR/mcp.json  (`claude --mcp-config "$ENVHUB_MCP_CONFIG"`)
  CHANNEL_DIR/codex.toml (append to $CODEX_HOME/config.toml), CHANNEL_DIR/opencode.json
  (OPENCODE_CONFIG=...): ready-made configs of the same server for Codex and opencode.
The command runs in the sandbox's workdir with the sandbox's own limits (no network, no
docker socket, no host paths beyond the sandbox's); every process it started is killed
when the agent phase ends (`Sandbox.end_processes`).
"""

from __future__ import annotations

import asyncio
import functools
import shlex
from pathlib import Path
from typing import Any

from envhub.envs.agents.base import AgentContext, AgentResult
from envhub.envs.agents.channel import PLACEHOLDER_KEY
from envhub.envs.agents.command import PLACEHOLDERS, TAIL_CHARS, command_words, substitute
from envhub.envs.agents.install import build_bundle, parse_installs
from envhub.envs.environment import EnvFailure
from envhub.envs.errors import AgentError, AgentSpecError

CHANNEL_DIR = "/run/envhub"  # the rollout's channel folder: socket + task file
LOCAL_AGENT_HOME = "/run/envhub-agent"  # local: the bundle, bound read-only
PORT = 4141
KINDS = ("docker", "local")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_LAUNCH = """set -e
rm -f /tmp/.envhub-forwarder
python3 {home}/forwarder.py {port} {channel}/gateway.sock /tmp/.envhub-forwarder &
i=0; while [ ! -e /tmp/.envhub-forwarder ]; do
  i=$((i+1))
  [ $i -lt 200 ] || {{ echo 'envhub: the gateway forwarder did not start' >&2; exit 125; }}
  sleep 0.05
done
set +e
{command}
"""


class BoxedCommandAgent:
    in_sandbox = True

    def __init__(self, command: str, installs: list[str] | None = None) -> None:
        self.argv = command_words(command)
        self.name = command
        self.installs = parse_installs(installs or [])
        self._bundles: dict[str, Path] = {}
        self._images: dict[str, str] = {}
        self._lock = asyncio.Lock()

    async def bundle(self, python: str) -> Path:
        """The bundle for the sandbox's Python version (built once per run, cached on disk)."""
        async with self._lock:
            if python not in self._bundles:
                self._bundles[python] = await asyncio.to_thread(build_bundle, self.installs,
                                                                python)
            return self._bundles[python]

    async def prepare(self, kind: str) -> None:
        """Before any rollout: refuse kinds it cannot run in; build the local bundle (so a
        package that cannot be had fails the run up front, exit 2)."""
        if kind not in KINDS:
            raise AgentSpecError(
                f"command agents run inside the rollout's sandbox, and {kind!r} sandboxes "
                "cannot host one here (they need a host folder bound in: docker or local with "
                "bubblewrap); use --sandbox docker|local, or --agent-on-host to run it on this "
                "machine (no containment)")
        if kind == "local":
            await self.bundle(_host_python())

    async def sandbox_options(self, kind: str, image: str | None, channel: Path
                              ) -> tuple[str | None, dict[str, str]]:
        """(image to use instead of the environment's, binds) for the agent's sandbox."""
        if kind == "local":
            bundle = await self.bundle(_host_python())
            return None, {str(channel): CHANNEL_DIR, str(bundle): LOCAL_AGENT_HOME}
        from envhub.envs.agents.layer import agent_image, image_python

        assert image is not None
        async with self._lock:
            cached = self._images.get(image)
        if cached is None:
            python = await asyncio.to_thread(image_python, image)
            bundle = await self.bundle(python)
            cached = await asyncio.to_thread(agent_image, image, bundle)
            async with self._lock:
                self._images[image] = cached
        return cached, {str(channel): CHANNEL_DIR}

    async def run(self, ctx: AgentContext) -> AgentResult:
        box = ctx.sandbox
        kind = getattr(box, "kind", None)
        channel: Any = ctx.state.get("channel")
        if kind not in KINDS or channel is None:
            raise EnvFailure(f"the rollout's sandbox ({kind}) was not prepared for an "
                             "in-sandbox agent")
        from envhub.envs.agents.layer import AGENT_HOME

        home = AGENT_HOME if kind == "docker" else LOCAL_AGENT_HOME
        folder = Path(channel.folder)
        (folder / "task.md").write_text(ctx.task.instruction, encoding="utf-8")
        task_file = f"{CHANNEL_DIR}/task.md"
        values = {"{instruction}": ctx.task.instruction, "{task_file}": task_file,
                  "{task_id}": ctx.task.id, "{model}": ctx.model}
        assert set(values) == set(PLACEHOLDERS)
        command = shlex.join(substitute(a, values) for a in self.argv)
        script = _LAUNCH.format(home=home, port=PORT, channel=CHANNEL_DIR, command=command)
        root = f"http://127.0.0.1:{PORT}"
        env = {"PATH": f"{home}/bin:{DEFAULT_PATH}",
               "OPENAI_BASE_URL": f"{root}/v1", "OPENAI_API_KEY": PLACEHOLDER_KEY,
               "ANTHROPIC_BASE_URL": root, "ANTHROPIC_API_KEY": PLACEHOLDER_KEY,
               "ENVHUB_SESSION_ID": str(ctx.session.id), "ENVHUB_TASK_ID": ctx.task.id,
               "ENVHUB_TASK_FILE": task_file, "ENVHUB_MODEL": ctx.model,
               "ENVHUB_SANDBOX_KIND": kind}
        tools = channel.mcp
        # the environment's tools, over MCP on the same forwarder (answering 503 with the
        # reason when they exist but cannot be served: the runner then drops the rollout)
        if tools is not None or channel.mcp_unavailable is not None:
            from envhub.envs.mcp.server import client_configs

            for name, text in client_configs(f"{root}/mcp").items():
                (folder / name).write_text(text, encoding="utf-8")
            env |= {"ENVHUB_MCP_URL": f"{root}/mcp",
                    "ENVHUB_MCP_CONFIG": f"{CHANNEL_DIR}/mcp.json"}
        result = await box.exec(script, timeout=ctx.limits.time_limit_s, env=env)
        stopped = "time_limit" if result.timed_out else "exited"
        rc = None if result.timed_out else result.exit_code
        info = {"exit_code": rc, "stdout_tail": result.stdout[-TAIL_CHARS:],
                "stderr_tail": result.stderr[-TAIL_CHARS:], "in_sandbox": kind,
                "gateway_requests": channel.requests, "refused_requests": channel.refused}
        if channel.mcp_unavailable is not None:
            info |= {"mcp_unavailable": channel.mcp_unavailable,
                     "mcp_unavailable_requests": channel.mcp_unavailable_hits}
        if tools is not None:
            info |= {"mcp_requests": channel.mcp_requests, "tool_calls": tools.calls,
                     "tool_errors": tools.errors, "submitted": tools.submitted}
            # a tool's exception the agent could not have caused ends the rollout as under the
            # built-in agent; one in its own, still healthy, sandbox was a tool error (graded)
            failure = await tools.failure_after_agent()
            if failure is not None:
                raise failure
        if rc == 125:
            raise EnvFailure(f"in-sandbox agent could not start: {result.stderr[-500:]}")
        if rc not in (0, None):
            raise AgentError(f"agent command exited with code {rc}: {result.stderr[-500:]}")
        return AgentResult(stopped=stopped, info=info)


@functools.lru_cache(maxsize=1)
def _host_python() -> str:
    """The Python version `python3` has inside a local sandbox (the host's system one)."""
    import shutil
    import subprocess

    program = shutil.which("python3", path=DEFAULT_PATH)
    if program is None:
        raise AgentSpecError("in-sandbox agents need python3 on this machine (apt-get install "
                             "python3), or use --agent-on-host")
    out = subprocess.run([program, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout
    return out.strip()
