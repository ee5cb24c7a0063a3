"""`webtask`: drive a small web app through browser tools; graded on the app's final state.

The app (runtime/app.js: a to-do list and a settings form) and Chromium both run inside the
rollout's sandbox (local bubblewrap or docker; envs/browser/sandbox.py), with no network:
every tool call runs runtime/driver.js there (with the Node.js and `playwright-core` that ship
with Playwright for Python: staged read-only for local sandboxes, baked into the docker
image), which starts the app and the browser, restores the previous page, acts, and saves
the page again. The
agent has only browser tools (no shell), so the app's state file changes only through the
app. The verifier compares that file with the task's expected state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envhub.envs.browser.chromium import BrowserUnavailable
from envhub.envs.browser.sandbox import BrowserPaths, browser_spec, paths_in, resolved_kind
from envhub.envs.builtin.webtask.tools import SCHEMAS, request
from envhub.envs.environment import (
    UNGRADABLE,
    EnvFailure,
    RunContext,
    Task,
    ToolResult,
    Verdict,
)
from envhub.envs.loader import task_rows
from envhub.envs.manifest import Manifest
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxFileError
from envhub.sdk.types import Signal

RUNTIME = Path(__file__).parent / "runtime"
BROWSER_DIR = ".browser"  # driver.js, app.js, request.json, session.json
STATE_FILE = ".webapp/state.json"
CALL_TIMEOUT_S = 60.0

INSTRUCTION = """{goal}

Use the browser tools (read_page, navigate, click, type, select) on the web app at
http://127.0.0.1:8080/, then call submit. The task is checked on the app's saved data."""


class WebTaskEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = Path(folder)
        self.manifest = manifest

    def load_tasks(self) -> list[Task]:
        return [Task(id=str(row["id"]), instruction=INSTRUCTION.format(goal=row["goal"]),
                     data=row) for row in task_rows(self.folder, self.manifest.tasks)]

    def tools(self, task: Task) -> list[str]:
        return list(self.manifest.tools)

    def tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        return [SCHEMAS[name] for name in self.tools(task) if name in SCHEMAS]

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        try:  # Chromium and the runtime for this kind (for docker: its image, built once)
            spec = await browser_spec(self.manifest.sandbox, resolved_kind(ctx.sandbox_kind))
        except BrowserUnavailable as e:
            raise EnvFailure(str(e)) from None
        sandbox = await ctx.open_sandbox(spec)
        try:
            for name in ("driver.js", "app.js"):
                await sandbox.upload(str(RUNTIME / name), f"{BROWSER_DIR}/{name}")
            await sandbox.write_file(STATE_FILE, json.dumps(task.data["initial"]).encode())
            await self.browse(sandbox, {"action": "read_page", "args": {}})  # it all starts
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    async def browse(self, sandbox: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
        """One driver run: the page after `req` ({url, title, snapshot, error})."""
        await sandbox.write_file(f"{BROWSER_DIR}/request.json", json.dumps(req).encode())
        workdir = getattr(sandbox, "workdir", "/workspace")
        paths = browser_paths(sandbox)
        result = await sandbox.exec(
            f"{paths.node} {BROWSER_DIR}/driver.js {workdir}/{BROWSER_DIR}",
            timeout=CALL_TIMEOUT_S,
            env={**paths.env(), "WEBAPP_STATE": f"{workdir}/{STATE_FILE}"})
        if result.exit_code == 127:
            raise EnvFailure(f"the browser runtime ({paths.node}) is not visible in the "
                             f"sandbox: {result.stderr.strip()[-300:]}")
        try:
            page = json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            raise EnvFailure(f"the browser driver failed (exit {result.exit_code}"
                             f"{', timed out' if result.timed_out else ''}): "
                             f"{result.stderr.strip()[-500:]}") from None
        return dict(page)

    async def call_tool(self, task: Task, name: str, arguments: str, sandbox: Sandbox,
                        state: dict[str, Any]) -> ToolResult:
        req = request(name, arguments)
        if isinstance(req, ToolResult):
            return req
        page = await self.browse(sandbox, req)
        text = f"URL: {page['url']}\nTitle: {page['title']}\n{page['snapshot']}"
        if page.get("error"):
            return ToolResult(f"error: {page['error']}\n\n{text}", is_error=True)
        return ToolResult(text)

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        """The gold solution: the task's tool calls, through the same driver as the agent's."""
        for step in task.data["solution"]:
            page = await self.browse(sandbox, {"action": step["tool"], "args": step["args"]})
            if page.get("error"):
                raise EnvFailure(f"{task.id}: gold step {step} failed: {page['error']}")

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        """The app writes its state whole (a temporary file renamed into place) and setup saves
        the first one, so a state file that is missing, too large or not the app's JSON was
        removed or written by the agent: 0 with the ungradable_output signal, never env_failure
        (a dropped sample would let a policy escape its bad groups that way)."""
        try:
            state = json.loads(await sandbox.read_file(STATE_FILE))
            if not isinstance(state, dict):
                raise ValueError(f"a JSON {type(state).__name__}, not the app's object")
        except (SandboxFileError, ValueError) as e:  # JSONDecodeError is a ValueError
            why = f"the app's state is not the app's: {e}"
            return Verdict(0.0, False, {"problems": [why]},
                           signals=[Signal(name=UNGRADABLE, info={"error": why})])
        problems = check_state(state, task.data["expected"])
        return Verdict(0.0 if problems else 1.0, not problems,
                       {"problems": problems[:10], "todos": state.get("todos", [])[:50]})


def browser_paths(sandbox: Sandbox) -> BrowserPaths:
    """Where the runtime is inside `sandbox` (by its kind); EnvFailure with the fix."""
    try:
        return paths_in(str(getattr(sandbox, "kind", "")))
    except BrowserUnavailable as e:
        raise EnvFailure(str(e)) from None


def check_state(state: dict[str, Any], expected: dict[str, Any]) -> list[str]:
    """What differs from `expected`: `todos` as an exact set of (title, done), `settings` as a
    subset of the saved settings."""
    problems = []
    if "todos" in expected:
        have = sorted((str(t.get("title")), bool(t.get("done"))) for t in state.get("todos", []))
        want = sorted((str(title), bool(done)) for title, done in expected["todos"])
        if have != want:
            problems.append(f"to-dos are {have}, expected {want}")
    for key, value in expected.get("settings", {}).items():
        if state.get("settings", {}).get(key) != value:
            problems.append(f"settings.{key} is {state.get('settings', {}).get(key)!r}, "
                            f"expected {value!r}")
    return problems
