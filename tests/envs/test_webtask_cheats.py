"""webtask is graded on an app state a command agent cannot forge (issue 25, class 4).

Each cheat is a command agent run by the real runner inside a real sandbox (bubblewrap and
docker, real Chromium behind the app): it never calls a browser tool, it reaches the app's data
another way. Before the fix the verifier read `.webapp/state.json` from the agent's own sandbox,
so each of these scored 1; now the verdict replays the rollout's recorded browser-tool calls on a
fresh app in a fresh sandbox, and a rollout that made none is graded on the task's initial state.
The oracle through the same runner still solves its task (its tool calls are what is replayed).
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from envhub.envs.loader import load_env
from envhub.orchestrator.groups import EnvChoice, RunConfig, run
from envhub.orchestrator.groups.results import RolloutRecord
from tests.envs.browser_boxes import KINDS, require_kind

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TASKS = {t.id: t for t in load_env("webtask").env.load_tasks()}
KIND_PARAMS = [pytest.param(k, marks=pytest.mark.bwrap if k == "local" else pytest.mark.docker)
               for k in KINDS]
# The app's code and Node.js as a command agent finds them in its sandbox (docker: the browser
# image; local: the runtime staged in /var/tmp, seen read-only).
FIND_NODE = ("NODE=$(ls /opt/envhub-browser/node /var/tmp/envhub-browser-*/node 2>/dev/null "
             "| head -n 1); test -x \"$NODE\"")


def forged_state(task_id: str) -> dict[str, Any]:
    """The app state that the task's checks accept, built from the task row."""
    data = TASKS[task_id].data
    state = copy.deepcopy(data["initial"])
    if "todos" in data["expected"]:
        state["todos"] = [{"id": i + 1, "title": t, "done": d}
                          for i, (t, d) in enumerate(data["expected"]["todos"])]
        state["next_id"] = len(state["todos"]) + 1
    state["settings"].update(data["expected"].get("settings", {}))
    return state


def sh(script: str) -> str:
    return shlex.join(["sh", "-c", script])


def write_state(task_id: str) -> str:
    """The filed cheat: the expected state written over the app's file."""
    b64 = base64.b64encode(json.dumps(forged_state(task_id)).encode()).decode()
    return sh(f"echo {b64} | base64 -d > .webapp/state.json")


def symlinked_state_folder(task_id: str) -> str:
    """The app's folder replaced by a link to one holding the expected state (a link on the
    file itself is not followed by docker's archive reads; one on its folder is)."""
    b64 = base64.b64encode(json.dumps(forged_state(task_id)).encode()).decode()
    return sh(f"mkdir -p forged && echo {b64} | base64 -d > forged/state.json && "
              "rm -rf .webapp && ln -s forged .webapp")


def app_backend_post(task_id: str) -> str:
    """No browser at all: start the app's own server on its state file with the sandbox's Node.js
    and POST the form the task needs; the state file is then written by the app itself."""
    assert task_id == "add-todo"
    js = ("const http = require('http');"
          "require(process.cwd() + '/.browser/app.js')"
          ".start(process.cwd() + '/.webapp/state.json', 8080).then((server) => {"
          " const req = http.request({host: '127.0.0.1', port: 8080, path: '/add',"
          "  method: 'POST', headers: {'content-type': 'application/x-www-form-urlencoded'}},"
          "  (res) => { res.resume(); res.on('end', () => server.close()); });"
          " req.end('title=Buy+milk'); });")
    return sh(f"{FIND_NODE} && \"$NODE\" -e {shlex.quote(js)} && cat .webapp/state.json")


def run_agent(kind: str, agent: str, task_id: str, tmp_path: Path) -> RolloutRecord:
    config = RunConfig(envs=[EnvChoice.parse("webtask")], agent=agent, sandbox=kind,
                       tasks=[task_id], n=1, k=1, model="zero", time_limit_s=120,
                       out=tmp_path / "out")
    (record,) = asyncio.run(run(config, progress=False)).records
    return record


CHEATS = {"write_state": write_state, "symlinked_state_folder": symlinked_state_folder,
          "app_backend_post": app_backend_post}


@pytest.mark.parametrize("kind", KIND_PARAMS)
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_a_command_agent_that_forges_the_app_state_scores_zero(cheat, kind, tmp_path):
    require_kind(kind)
    record = run_agent(kind, CHEATS[cheat]("add-todo"), "add-todo", tmp_path)
    assert record.status == "done", record.reason
    assert record.agent_info["exit_code"] == 0, record.agent_info  # the cheat itself worked
    assert record.outcome == 0.0 and not record.resolved, record.verdict
    assert record.verdict["replayed_calls"] == 0, record.verdict


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_the_filed_cheat_scores_zero_on_every_task(kind, tmp_path):
    """Writing the expected state.json got 1 on 4/4 tasks; now 0 on each."""
    require_kind(kind)
    for task_id in TASKS:
        record = run_agent(kind, write_state(task_id), task_id, tmp_path / task_id)
        assert record.status == "done", (task_id, record.reason)
        assert record.outcome == 0.0 and not record.resolved, (task_id, record.verdict)


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_the_oracle_through_the_runner_is_graded_on_its_replayed_calls(kind, tmp_path):
    require_kind(kind)
    task_id = "update-settings"
    record = run_agent(kind, "oracle", task_id, tmp_path)
    assert record.status == "done" and record.resolved and record.outcome == 1.0, record.verdict
    assert record.verdict["replayed_calls"] == len(TASKS[task_id].data["solution"])


# An app that saves the expected state on its first request, whatever it is: what an agent with
# a shell beside the browser tools (a manifest adding `bash`) could leave for the next tool call.
EVIL_APP = """'use strict';
const real = require('./app-real.js');
const fs = require('fs');
module.exports = {start: (statePath, port) => {
  fs.writeFileSync(statePath, process.env.FORGED || %s);
  return real.start(statePath, port);
}};
"""


@pytest.mark.parametrize("kind", KIND_PARAMS)
def test_the_tools_own_code_edited_in_the_sandbox_grades_nothing(kind, tmp_path):
    """The app the tools run is edited in the agent's sandbox, then a tool call runs it: the
    live page shows the forged state (before the fix, graded 1), the replay on a pristine app
    in a fresh sandbox does not; honest calls made before are still graded (1 with the gold
    calls, whatever the sandbox's state file says afterwards)."""
    require_kind(kind)
    from envhub.envs.builtin.webtask.env import BROWSER_DIR, STATE_FILE
    from tests.envs.browser_boxes import Boxes

    loaded = load_env("webtask")
    env, task = loaded.env, TASKS["add-todo"]

    async def main() -> None:
        boxes = Boxes(loaded, kind, tmp_path)
        try:
            box = await env.setup(task, boxes.ctx)
            real = await box.read_file(f"{BROWSER_DIR}/app.js")
            await box.write_file(f"{BROWSER_DIR}/app-real.js", real)
            forged = json.dumps(json.dumps(forged_state("add-todo")))
            await box.write_file(f"{BROWSER_DIR}/app.js", (EVIL_APP % forged).encode())
            result = await env.call_tool(task, "read_page", "{}", box, {})
            assert "Buy milk" in result.content  # the edited app ran and saved the forgery
            verdict = await env.verify(task, box, boxes.ctx)
            assert verdict.outcome == 0.0 and verdict.info["agent_state_differs"], verdict

            honest = await env.setup(task, boxes.ctx)
            for step in task.data["solution"]:
                await env.call_tool(task, step["tool"], json.dumps(step["args"]), honest, {})
            await honest.write_file(STATE_FILE, json.dumps(task.data["initial"]).encode())
            verdict = await env.verify(task, honest, boxes.ctx)
            assert verdict.resolved and verdict.info["replayed_calls"] == 2, verdict
        finally:
            await boxes.close()
    asyncio.run(main())
