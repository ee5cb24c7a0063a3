"""The browser pieces' failure modes: a missing Chromium makes grading an env_failure (never a
score of 0), and a staged runtime folder someone else could have written is refused."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from envhub.envs.browser.chromium import CHROMIUM_ENV, BrowserUnavailable, playwright_core
from envhub.envs.browser.runtime import RUNTIME_ENV, staged_runtime
from envhub.envs.environment import EnvFailure, RunContext
from envhub.envs.loader import load_env
from envhub.envs.runner.memory_sandbox import MemorySandbox
from tests.support import require_browser


def test_without_chromium_slides_grading_is_an_env_failure(tmp_path, monkeypatch):
    require_browser()
    monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "no-such-chromium"))
    env = load_env("slides").env
    task = env.load_tasks()[0]

    async def box(spec):
        return MemorySandbox()
    ctx = RunContext(run_id="t", sandbox_kind="none", open_sandbox=box, scratch=tmp_path)

    async def main():
        sandbox = await env.setup(task, ctx)
        await env.solve(task, sandbox, ctx)
        return await env.verify(task, sandbox, ctx)
    verdict = asyncio.run(main())
    assert verdict.env_failure and CHROMIUM_ENV in verdict.env_failure
    # and webtask refuses to set up, before any sandbox is opened
    web = load_env("webtask").env
    with pytest.raises(EnvFailure, match=CHROMIUM_ENV):
        asyncio.run(web.setup(web.load_tasks()[0], ctx))


def test_a_runtime_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    require_browser()
    version = json.loads((playwright_core() / "package.json").read_text())["version"]
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path))
    planted = tmp_path / f"envhub-browser-{version}-uid{os.geteuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(BrowserUnavailable, match="writable by others"):
        staged_runtime()
