"""`webtask`: the app and Chromium run inside a sandbox (local bubblewrap, and docker with the
browser image), driven through the browser tools; the oracle's tool calls solve every task in
both, doing nothing solves none, and the tools refuse what they must (other origins, unknown
elements, bad arguments)."""

from __future__ import annotations

import asyncio
import json

import pytest

from envhub.envs.builtin.webtask.env import STATE_FILE
from envhub.envs.loader import load_env
from envhub.envs.sandbox.base import MAX_READ_BYTES
from envhub.orchestrator.groups.memory_sandbox import MemorySandbox
from tests.envs.browser_boxes import KINDS, Boxes, require_kind

pytestmark = pytest.mark.browser

LOADED = load_env("webtask")
ENV = LOADED.env
TASKS = {t.id: t for t in ENV.load_tasks()}


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_oracle_solves_every_task_and_doing_nothing_solves_none(kind, tmp_path):
    require_kind(kind)

    async def main() -> None:
        boxes = Boxes(LOADED, kind, tmp_path)
        try:
            assert len(TASKS) >= 4
            for task in TASKS.values():
                sandbox = await ENV.setup(task, boxes.ctx)
                assert sandbox.kind == kind
                untouched = await ENV.verify(task, sandbox, boxes.ctx)
                assert not untouched.resolved and untouched.outcome == 0.0, task.id
                await ENV.solve(task, sandbox, boxes.ctx)
                verdict = await ENV.verify(task, sandbox, boxes.ctx)
                assert verdict.resolved and verdict.outcome == 1.0, (task.id, verdict.info)
        finally:
            await boxes.close()
    asyncio.run(main())


@pytest.mark.slow
@pytest.mark.bwrap
def test_browser_tools_keep_the_page_between_calls_and_refuse_what_they_must(tmp_path):
    require_kind("local")
    task = TASKS["add-todo"]

    async def main() -> None:
        boxes = Boxes(LOADED, "local", tmp_path)
        try:
            sandbox = await ENV.setup(task, boxes.ctx)

            async def call(name: str, args: object) -> tuple[bool, str]:
                text = args if isinstance(args, str) else json.dumps(args)
                r = await ENV.call_tool(task, name, text, sandbox, {})
                return r.is_error, r.content

            error, page = await call("read_page", {})
            assert not error and 'button "Complete Pay rent"' in page and "URL: http" in page
            # typed text survives into the next call (a new browser each time)
            assert not (await call("type", {"field": "New to-do", "text": "Walk dog"}))[0]
            error, page = await call("read_page", {})
            assert 'textbox "New to-do": Walk dog' in page, page
            error, page = await call("click", {"name": "Add"})
            assert not error and "Added Walk dog." in page
            saved = json.loads(await sandbox.read_file(STATE_FILE))
            assert ["Walk dog", False] in [[t["title"], t["done"]] for t in saved["todos"]]
            # the model's mistakes are error results that show the page, never exceptions
            error, page = await call("navigate", {"url": "http://example.com/"})
            assert error and "only the app" in page
            error, page = await call("navigate", {"url": "file:///etc/passwd"})
            assert error and "only the app" in page
            error, page = await call("click", {"name": "Launch rockets"})
            assert error and "no button or link" in page and "Title: To-do list" in page
            error, page = await call("click", {"name": "Pay rent"})  # a name that is text only
            assert error
            for name, args in (("click", {}), ("type", {"field": 3, "text": "x"}),
                               ("navigate", "{not json"), ("select", {"field": "Theme"})):
                error, message = await call(name, args)
                assert error and "e.g." in message, (name, message)
            error, page = await call("navigate", {"url": "/settings"})
            assert not error and 'combobox "Theme"' in page
            error, page = await call("type", {"field": "Theme", "text": "Dark"})  # a drop-down
            assert error and "Title: Settings" in page, page
        finally:
            await boxes.close()
    asyncio.run(main())


@pytest.mark.parametrize("content", [None, b"{not json", b"[1, 2]", b'"a string"',
                                     b" " * (MAX_READ_BYTES + 1)])
def test_a_state_the_app_did_not_write_scores_zero_not_env_failure(content, tmp_path):
    """The app saves its state whole, so a missing, malformed or oversized state file is the
    agent's doing (a command agent deleting or overwriting it): 0 with the ungradable_output
    signal, never env_failure, which training would drop."""
    task = next(iter(TASKS.values()))
    box = MemorySandbox()
    if content is not None:
        asyncio.run(box.write_file(STATE_FILE, content))
    verdict = asyncio.run(ENV.verify(task, box, None))  # type: ignore[arg-type]
    assert verdict.env_failure is None and verdict.outcome == 0.0 and not verdict.resolved
    assert [s.name for s in verdict.signals] == ["ungradable_output"], verdict


def test_a_sandbox_this_environment_did_not_set_up_is_not_graded(tmp_path):
    """Grading replays the browser-tool calls recorded for the sandbox setup returned; a state
    file alone (in a sandbox with no record) is never graded: EnvFailure, the runner's bug."""
    from envhub.envs.environment import EnvFailure

    task = TASKS["add-todo"]
    box = MemorySandbox()
    asyncio.run(box.write_file(STATE_FILE, json.dumps(task.data["initial"]).encode()))
    with pytest.raises(EnvFailure, match="no record"):
        asyncio.run(ENV.verify(task, box, None))  # type: ignore[arg-type]
