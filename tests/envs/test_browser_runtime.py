"""The browser pieces' failure modes: a missing Chromium makes grading an env_failure (never a
score of 0), and a staged runtime folder someone else could have written is refused."""

from __future__ import annotations

import asyncio
import json
import os

import pytest

from envhub.envs.browser.chromium import CHROMIUM_ENV, BrowserUnavailable, playwright_core
from envhub.envs.browser.runtime import RUNTIME_ENV, staged_runtime
from envhub.envs.environment import EnvFailure
from envhub.envs.loader import load_env
from tests.envs.browser_boxes import Boxes, require_kind
from tests.support import require_browser


@pytest.mark.bwrap
def test_without_chromium_slides_grading_is_an_env_failure(tmp_path, monkeypatch):
    require_kind("local")
    loaded = load_env("slides")
    env = loaded.env
    task = env.load_tasks()[0]

    async def main():
        boxes = Boxes(loaded, "local", tmp_path)
        try:
            sandbox = await env.setup(task, boxes.ctx)
            await env.solve(task, sandbox, boxes.ctx)
            monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "no-such-chromium"))
            verdict = await env.verify(task, sandbox, boxes.ctx)
            # and a new rollout refuses to set up, before any sandbox is opened
            opened = len(boxes.opened)
            with pytest.raises(EnvFailure, match=CHROMIUM_ENV):
                await env.setup(task, boxes.ctx)
            assert len(boxes.opened) == opened
            return verdict
        finally:
            await boxes.close()
    verdict = asyncio.run(main())
    assert verdict.env_failure and CHROMIUM_ENV in verdict.env_failure
    # webtask too
    monkeypatch.setenv(CHROMIUM_ENV, str(tmp_path / "no-such-chromium"))
    web = load_env("webtask")
    boxes = Boxes(web, "local", tmp_path)
    with pytest.raises(EnvFailure, match=CHROMIUM_ENV):
        asyncio.run(web.env.setup(web.env.load_tasks()[0], boxes.ctx))
    assert boxes.opened == []


def test_a_runtime_folder_others_can_write_is_refused(tmp_path, monkeypatch):
    require_browser()
    version = json.loads((playwright_core() / "package.json").read_text())["version"]
    monkeypatch.setenv(RUNTIME_ENV, str(tmp_path))
    planted = tmp_path / f"envhub-browser-{version}-uid{os.geteuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(BrowserUnavailable, match="writable by others"):
        staged_runtime()
