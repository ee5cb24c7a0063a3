"""`webtask`: drive a small web app through browser tools; graded on the app's final state.

The app (runtime/app.js: a to-do list and a settings form) and Chromium both run inside the
rollout's sandbox (local bubblewrap or docker; envs/browser/sandbox.py), with no network:
every tool call runs runtime/driver.js there (with the Node.js and `playwright-core` that ship
with Playwright for Python: staged read-only for local sandboxes, baked into the docker
image), which starts the app and the browser, restores the previous page, acts, and saves
the page again.

Grading replays, never reads (issue 25): the app's state file sits in the agent's sandbox, where a
command agent (a shell, no browser tools) can write it, restart the app on a state of its
choosing or edit the app itself. So the environment records, on the host, every browser-tool call
it ran for the rollout (its own tool channel: `call_tool`, and the oracle's `solve`), and
`verify` replays those calls in a FRESH sandbox, on a fresh app and driver from this package,
and checks the state that replay leaves. The agent's declared output is its tool-call
trajectory; a rollout that made no call is graded on the task's initial state (no sandbox
needed). This holds in docker and local sandboxes alike, because it relies on nothing of the
sandbox but being fresh: no uid split or hidden path that one kind has and the other lacks.
"""

from __future__ import annotations

import json
import weakref
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
from envhub.envs.sandbox.errors import FileTooLarge, SandboxFileError
from envhub.sdk.types import Signal

RUNTIME = Path(__file__).parent / "runtime"
BROWSER_DIR = ".browser"  # driver.js, app.js, request.json, session.json
STATE_FILE = ".webapp/state.json"
CALL_TIMEOUT_S = 60.0
REPLAY_STEP_S = 15.0  # per replayed call, beyond CALL_TIMEOUT_S: a goto and an action, 5 s each

INSTRUCTION = """{goal}

Use the browser tools (read_page, navigate, click, type, select) on the web app at
http://127.0.0.1:8080/, then call submit. The task is checked on the app's saved data."""


class WebTaskEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        # The browser-tool calls each rollout's sandbox has seen, host-side: what `verify`
        # replays. Keyed by the sandbox object, so a sandbox that is gone takes its list along.
        self.calls: weakref.WeakKeyDictionary[Sandbox, list[dict[str, Any]]] = \
            weakref.WeakKeyDictionary()

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
            await install_app(sandbox, task)
            await self.browse(sandbox, {"action": "read_page", "args": {}})  # it all starts
        except BaseException:
            await sandbox.close()
            raise
        self.calls[sandbox] = []
        return sandbox

    async def browse_recorded(self, sandbox: Sandbox, req: dict[str, Any]) -> dict[str, Any]:
        """`browse`, and the call kept for `verify` to replay once it has run (a call cut off
        by the agent's time limit is not; reading a page changes nothing, so read_page is not)."""
        page = await self.browse(sandbox, req)
        if req["action"] != "read_page":
            self.calls.setdefault(sandbox, []).append(req)
        return page

    async def browse(self, sandbox: Sandbox, req: dict[str, Any] | list[dict[str, Any]],
                     timeout: float = CALL_TIMEOUT_S) -> dict[str, Any]:
        """One driver run: the page after `req`, one call or a list run in order ({url, title,
        snapshot, error, steps, errors})."""
        await sandbox.write_file(f"{BROWSER_DIR}/request.json", json.dumps(req).encode())
        workdir = getattr(sandbox, "workdir", "/workspace")
        paths = browser_paths(sandbox)
        result = await sandbox.exec(
            f"{paths.node} {BROWSER_DIR}/driver.js {workdir}/{BROWSER_DIR}",
            timeout=timeout,
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
        page = await self.browse_recorded(sandbox, req)
        text = f"URL: {page['url']}\nTitle: {page['title']}\n{page['snapshot']}"
        if page.get("error"):
            return ToolResult(f"error: {page['error']}\n\n{text}", is_error=True)
        return ToolResult(text)

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        """The gold solution: the task's tool calls, through the same driver as the agent's."""
        for step in task.data["solution"]:
            page = await self.browse_recorded(sandbox, {"action": step["tool"],
                                                        "args": step["args"]})
            if page.get("error"):
                raise EnvFailure(f"{task.id}: gold step {step} failed: {page['error']}")

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        """The state that replaying the rollout's recorded tool calls on a fresh app leaves,
        checked against the task. The agent's own state file is never graded; one that is
        missing, too large or not the app's JSON (the app writes it whole, a temporary file
        renamed into place, and setup saves the first one) was broken by the agent: 0 with the
        ungradable_output signal, never env_failure (a dropped sample would let a policy escape
        its bad groups that way). A replay that cannot run is env_failure (EnvFailure)."""
        try:
            live = parse_state(await sandbox.read_file(STATE_FILE))
        except (SandboxFileError, ValueError) as e:  # JSONDecodeError is a ValueError
            return ungradable(f"the app's state is not the app's: {e}")
        calls = self.calls.pop(sandbox, None)
        if calls is None:
            raise EnvFailure(f"no record of the browser-tool calls of sandbox {sandbox.id}: "
                             "verify must get the sandbox this environment's setup returned")
        try:
            state = await self.replay(task, calls, ctx) if calls else task.data["initial"]
        except FileTooLarge as e:  # the app grew that large from the agent's own calls
            return ungradable(f"the replayed app state is too large: {e}")
        problems = check_state(state, task.data["expected"])
        return Verdict(0.0 if problems else 1.0, not problems,
                       {"problems": problems[:10], "todos": state.get("todos", [])[:50],
                        "replayed_calls": len(calls),
                        # the agent's own file differs: written outside the browser tools
                        "agent_state_differs": live != state})

    async def replay(self, task: Task, calls: list[dict[str, Any]],
                     ctx: RunContext) -> dict[str, Any]:
        """The app state after `calls`, run by one driver in a fresh sandbox (pristine app,
        driver and initial state from this package; nothing of the agent's sandbox)."""
        try:
            spec = await browser_spec(self.manifest.sandbox, resolved_kind(ctx.sandbox_kind))
        except BrowserUnavailable as e:
            raise EnvFailure(str(e)) from None
        box = await ctx.open_sandbox(spec)
        try:
            await install_app(box, task)
            page = await self.browse(box, calls,
                                     timeout=CALL_TIMEOUT_S + REPLAY_STEP_S * len(calls))
            if page.get("steps") != len(calls):
                raise EnvFailure(f"the replay ran {page.get('steps')} of {len(calls)} calls")
            try:
                return parse_state(await box.read_file(STATE_FILE))
            except FileTooLarge:
                raise
            except (SandboxFileError, ValueError) as e:  # the pristine app wrote it: ours
                raise EnvFailure(f"the replayed app left no state of its own: {e}") from None
        finally:
            await box.close()


async def install_app(sandbox: Sandbox, task: Task) -> None:
    """The driver, the app and the task's initial state, from this package, into `sandbox`."""
    for name in ("driver.js", "app.js"):
        await sandbox.upload(str(RUNTIME / name), f"{BROWSER_DIR}/{name}")
    await sandbox.write_file(STATE_FILE, json.dumps(task.data["initial"]).encode())


def parse_state(raw: bytes) -> dict[str, Any]:
    """The app's state object; ValueError when `raw` is not one."""
    state = json.loads(raw)
    if not isinstance(state, dict):
        raise ValueError(f"a JSON {type(state).__name__}, not the app's object")
    return state


def ungradable(why: str) -> Verdict:
    return Verdict(0.0, False, {"problems": [why]},
                   signals=[Signal(name=UNGRADABLE, info={"error": why})])


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
