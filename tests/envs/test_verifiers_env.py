"""verifiers environments (envs/verifiers) at the process boundary: the up-front errors that
state their fix, what is refused, how the worker's answers become verdicts, and the episode
record only the harness may write. The CLI runs are tests/e2e/test_verifiers_cli.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from envhub.envs.agents import agent_for, agents_for
from envhub.envs.environment import UNGRADABLE, RunContext, Task
from envhub.envs.errors import EnvLoadError, RunConfigError
from envhub.envs.loader import load_env
from envhub.envs.verifiers import manifest_for, process
from envhub.envs.verifiers.env import EPISODE_FILE, REWARD_RAISED, VerifiersEnv, _verdict
from tests.support import ended, require

VF_PYTHON = process.python()

# A verifiers 0.4 environment in verifiers' own format (`verifiers.v1`): a Taskset of Tasks
# whose `@vf.reward` reads the reply. `count` raises on a reply that is not a number.
CAPITALS = '''
import verifiers.v1 as vf


class Question(vf.TaskData):
    answer: str


class CapitalTask(vf.Task[Question, vf.State]):
    @vf.reward
    async def exact(self, task: Question, trace: vf.Trace) -> float:
        if task.id == "count":
            return float(int(trace.last_reply) == int(task.answer))
        return float(trace.last_reply.strip().lower() == task.answer.lower())


class CapitalsTaskset(vf.Taskset[CapitalTask]):
    def load(self):
        rows = [("Capital of France? One word.", "Paris", "paris"),
                ("Capital of Italy? One word.", "Rome", "rome"),
                ("How many capitals did you name? A number.", "2", "count")]
        for prompt, answer, id in rows:
            yield CapitalTask(Question(prompt=prompt, answer=answer, id=id), self.config.task)


__all__ = ["CapitalsTaskset"]
'''

# Scoring that needs the rollout's runtime (a file in the agent's box) cannot be honoured on
# the recorded trace alone: refused at load.
RUNTIME_REWARD = '''
import verifiers.v1 as vf


class FileTask(vf.Task[vf.TaskData, vf.State]):
    @vf.reward
    async def wrote_file(self, trace: vf.Trace, runtime) -> float:
        return 1.0


class FileTaskset(vf.Taskset[FileTask]):
    def load(self):
        yield FileTask(vf.TaskData(prompt="write a file"), self.config.task)


__all__ = ["FileTaskset"]
'''

# A taskset bundling a harness that runs the model's commands (verifiers' bash): refused, since
# verifiers' subprocess runtime would run them on this machine.
BASH_HARNESS = '''
import verifiers.v1 as vf
from verifiers.v1.harnesses.bash import BashHarness


class ShellTask(vf.Task[vf.TaskData, vf.State]):
    @vf.reward
    async def listed(self, trace: vf.Trace) -> float:
        return 0.0


class ShellTaskset(vf.Taskset[ShellTask]):
    def load(self):
        yield ShellTask(vf.TaskData(prompt="ls /"), self.config.task)


class Shell(BashHarness):
    pass


__all__ = ["ShellTaskset", "Shell"]
'''



def write_module(folder: Path, name: str, source: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text(source)
    return path


def require_verifiers() -> None:
    require(VF_PYTHON.exists(), f"verifiers' interpreter {VF_PYTHON} "
                                "(bash scripts/verifiers_venv.sh)")


def test_a_missing_venv_is_an_up_front_error_with_its_fix(tmp_path, monkeypatch):
    module = write_module(tmp_path, "capitals", CAPITALS)
    monkeypatch.setenv("ENVHUB_VERIFIERS_PYTHON", str(tmp_path / "no-venv" / "bin" / "python"))
    with pytest.raises(EnvLoadError, match="bash scripts/verifiers_venv.sh"):
        load_env(f"vf:{module}")


def test_a_worker_answering_garbage_is_an_infrastructure_failure(tmp_path, monkeypatch):
    """A worker that crashes mid-run is WorkerFailed (the rollout's env_failure), and one whose
    interpreter has no verifiers says how to install it."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Traceback: boom' >&2\necho not-json\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ENVHUB_VERIFIERS_PYTHON", str(fake))
    with pytest.raises(process.WorkerFailed, match="boom"):
        asyncio.run(process.acall(["score", "x", "k", "f"], 30))
    fake.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'verifiers'\" >&2\n"
                    "exit 1\n")
    with pytest.raises(process.VerifiersUnavailable, match="verifiers_venv.sh"):
        process.call(["tasks", "x"], 30)
    fake.write_text("#!/bin/sh\nsleep 30\n")
    with pytest.raises(process.WorkerFailed, match="took over"):
        asyncio.run(process.acall(["rollout", "x", "k", "f"], 1))


def test_rewards_map_onto_an_outcome_in_0_1():
    assert _verdict({"reward": 1.0, "rewards": {"exact": 1.0}}).outcome == 1.0
    high = _verdict({"reward": 3.5, "rewards": {"a": 1.0, "b": 2.5}})
    assert (high.outcome, high.resolved, high.info["clamped"]) == (1.0, True, True)
    assert _verdict({"reward": -2.0}).outcome == 0.0
    for raised in ({"error": "ValueError: invalid literal"}, {"reward": float("nan")},
                   {"reward": "1"}):
        verdict = _verdict(raised)
        assert verdict.outcome == 0.0 and verdict.env_failure is None, raised
        assert [s.name for s in verdict.signals] == [UNGRADABLE]


def _ctx(tmp_path: Path) -> RunContext:
    async def no_sandbox(spec):  # pragma: no cover - verify never opens one
        raise AssertionError("verify opened a sandbox")

    return RunContext(run_id="r", sandbox_kind="none", open_sandbox=no_sandbox,
                      scratch=tmp_path)


def test_only_the_episode_the_harness_wrote_is_graded(tmp_path):
    """No record (an agent other than the harness) and a record changed after the harness
    wrote it both score 0 with a signal: never env_failure, never the record's claim."""
    module = write_module(tmp_path, "capitals", CAPITALS)
    env = VerifiersEnv(*manifest_for(f"vf:{module}"))  # no worker call: none is needed here
    task = Task(id="paris", instruction="?", data={"key": "k"})
    verdict = asyncio.run(env.verify(task, None, _ctx(tmp_path)))  # type: ignore[arg-type]
    assert verdict.outcome == 0.0 and verdict.env_failure is None
    assert "did not run verifiers' harness" in verdict.info["ungradable"]
    (tmp_path / EPISODE_FILE).write_text(json.dumps({"traces": [{"rewards": {"x": 1}}]}))
    verdict = asyncio.run(env.verify(task, None, _ctx(tmp_path)))  # type: ignore[arg-type]
    assert verdict.outcome == 0.0 and "not the one the harness wrote" in \
        verdict.info["ungradable"]


def test_tasks_come_from_their_taskset(tmp_path):
    require_verifiers()
    module = write_module(tmp_path, "capitals", CAPITALS)
    loaded = load_env(f"vf:{module}")
    assert isinstance(loaded.env, VerifiersEnv) and loaded.name == "capitals"
    tasks = loaded.env.load_tasks()
    assert [t.id for t in tasks] == ["paris", "rome", "count"]
    assert tasks[0].instruction == "Capital of France? One word."
    assert loaded.env.harnesses == {"agent": "null"}  # verifiers' chat program, not bash
    assert len({t.data["key"] for t in tasks}) == 3


def test_rewards_that_read_the_runtime_are_refused_at_load(tmp_path):
    require_verifiers()
    module = write_module(tmp_path, "files", RUNTIME_REWARD)
    with pytest.raises(process.VerifiersUnsupported, match="read the runtime.*wrote_file"):
        load_env(f"vf:{module}")


def test_harnesses_that_run_the_models_code_are_refused_at_load(tmp_path):
    require_verifiers()
    module = write_module(tmp_path, "shell", BASH_HARNESS)
    with pytest.raises(process.VerifiersUnsupported, match="executes the model's code"):
        load_env(f"vf:{module}")


def test_the_oracle_answers_through_the_harness_and_is_scored_in_a_fresh_worker(tmp_path):
    """solve() runs verifiers' harness against a stand-in model replying the task's `answer`;
    verify() scores that episode with the task's own reward functions; `count`'s reward raises
    on nothing here (its answer is a number)."""
    require_verifiers()
    module = write_module(tmp_path, "capitals", CAPITALS)
    env = load_env(f"vf:{module}").env
    assert isinstance(env, VerifiersEnv)
    for task in env.load_tasks():
        scratch = tmp_path / task.id
        scratch.mkdir()
        ctx = _ctx(scratch)
        asyncio.run(env.solve(task, None, ctx))  # type: ignore[arg-type]
        record = json.loads((scratch / EPISODE_FILE).read_text())
        assert record["traces"][0]["rewards"] == {}  # scoring deferred to verify
        verdict = asyncio.run(env.verify(task, None, ctx))  # type: ignore[arg-type]
        assert (verdict.outcome, verdict.resolved) == (1.0, True), verdict
        assert verdict.info["verifiers_rewards"] == {"exact": 1.0}


def test_worker_replies_are_read_with_a_cap(tmp_path, monkeypatch):
    """An endless reply fails as soon as it passes the cap (nothing waits for its end, which
    under load used to take longer than the time limit), and the writer is stopped."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho $$ > {tmp_path}/pid\nexec tr '\\0' x < /dev/zero\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ENVHUB_VERIFIERS_PYTHON", str(fake))
    with pytest.raises(process.WorkerFailed, match="reply over"):
        asyncio.run(process.acall(["score", "x", "k", "f"], 600))
    assert ended(int((tmp_path / "pid").read_text()))


#: A fake worker's lines starting a process in a session of its own that runs `run`, and going
#: on only once that process has left the worker's group (it writes its pid after setsid; the
#: worker keeps it in $child, then shows it as the file `child`): before that, a stop's signal
#: to the group would take it too.
_ESCAPE = ("setsid sh -c 'echo $$ > {tmp}/up; {run}' &\n"
           "until [ -s {tmp}/up ]; do sleep 0.02; done\nchild=$(cat {tmp}/up)\n"
           "mv {tmp}/up {tmp}/child\n")


def _stopped_when_ready(tmp_path: Path) -> float:
    """Seconds a worker call took to stop, cancelled once the fake worker wrote `child` (its
    trap set, its child started), not on a timer a loaded machine can outrun."""

    async def stopped() -> None:
        call = asyncio.ensure_future(process.acall(["rollout", "x", "k", "f"], 300))
        while not (tmp_path / "child").exists():
            assert not call.done(), call.result()
            await asyncio.sleep(0.05)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call

    started = time.monotonic()
    asyncio.run(stopped())
    return time.monotonic() - started


def test_a_stopped_worker_gets_sigterm_first_for_what_it_started_elsewhere(tmp_path, monkeypatch):
    """verifiers starts the harness program in a session of its own, out of reach of a signal
    to the worker's group: the worker is sent SIGTERM first, so it stops what it started (the
    real worker cancels its episode and verifiers cleans up); SIGKILL only after a grace."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\ntrap 'kill $child; exit 143' TERM\n"
                    + _ESCAPE.format(tmp=tmp_path, run="exec sleep 300")
                    + "while :; do sleep 0.1; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ENVHUB_VERIFIERS_PYTHON", str(fake))

    assert _stopped_when_ready(tmp_path) < process.STOP_GRACE_S  # on SIGTERM, not SIGKILL
    assert ended(int((tmp_path / "child").read_text()))


def test_a_process_left_holding_the_workers_pipes_does_not_hang_the_stop(tmp_path, monkeypatch):
    """A process the worker started in a session of its own and did not stop keeps the
    worker's pipes open, writing now and then; the stop waits for the worker, not for that
    process (asyncio's `wait()` waits for both on Python 3.11), and gives up its pipes."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\ntrap 'exit 143' TERM\n" + _ESCAPE.format(
        tmp=tmp_path, run="while :; do echo tick >&2; sleep 0.3; done")
        + "while :; do sleep 0.1; done\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ENVHUB_VERIFIERS_PYTHON", str(fake))

    try:
        assert _stopped_when_ready(tmp_path) < process.STOP_GRACE_S
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int((tmp_path / "child").read_text()), signal.SIGKILL)


def test_a_reply_is_read_when_the_worker_exits_leaving_a_process_on_its_pipes(tmp_path,
                                                                             monkeypatch):
    """The worker replied and exited, but something it left in a session of its own holds its
    stdout: the reply is what it wrote, not a timeout after waiting for that process."""
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\n" + _ESCAPE.format(tmp=tmp_path, run="exec sleep 60")
                    + "echo 'some log line' >&2\necho '{\"reward\": 1.0}'\nexit 0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("ENVHUB_VERIFIERS_PYTHON", str(fake))
    try:
        reply = asyncio.run(process.acall(["score", "x", "k", "f"], 30))
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int((tmp_path / "child").read_text()), signal.SIGKILL)
    assert (reply.code, reply.body) == (0, {"reward": 1.0})
    assert "some log line" in reply.stderr


def test_the_real_worker_ends_on_sigterm(tmp_path):
    """worker.py cancels its call on SIGTERM, so verifiers' clean-up (`async with`) runs. The
    signal is sent once the call has started (its handler is set by then), not on a timer."""
    require_verifiers()
    code = (f"import asyncio, runpy\nw = runpy.run_path({str(process.WORKER)!r})\n"
            "async def call():\n    print('ready', flush=True)\n    await asyncio.sleep(300)\n"
            "asyncio.run(w['_until_sigterm'](call()))\n")
    proc = subprocess.Popen([str(VF_PYTHON), "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert b"CancelledError" in err


def test_verifiers_environments_run_their_own_agent(tmp_path):
    """No --agent: a verifiers environment runs `vf` (its harness), another `tool`; `oracle`
    acts on both; `tool` (or a command line) on a verifiers environment, and `vf` on another,
    are refused before anything starts, with the fix."""
    module = write_module(tmp_path, "capitals", CAPITALS)
    vf_env = VerifiersEnv(*manifest_for(f"vf:{module}"))
    other = object()
    assert agents_for(None, {"capitals": vf_env, "arith": other}) == {"capitals": "vf",
                                                                      "arith": "tool"}
    assert agent_for("oracle", vf_env) == agent_for("oracle", other) == "oracle"
    for spec in ("tool", "tool:summarize", "mini --yolo"):
        with pytest.raises(RunConfigError, match="drop --agent"):
            agent_for(spec, vf_env, "capitals")
    with pytest.raises(RunConfigError, match="not one"):
        agent_for("vf", other, "arith")


# A reward that raises on every reply, its gold answer included: the environment is broken.
BROKEN_REWARD = CAPITALS.replace("            return float(int(trace.last_reply) == "
                                 "int(task.answer))", "            raise ValueError('broken')")


def test_what_the_model_breaks_scores_0_unless_the_gold_answer_breaks_it_too(tmp_path):
    """A reward (or task hook) raising is the model's doing (0, ungradable_output) when the
    task's gold answer, run and scored the same way once per task, passes; env_failure when
    the gold answer fails the same way."""
    require_verifiers()
    for name, source, broken in (("capitals", CAPITALS, False), ("broken", BROKEN_REWARD, True)):
        env = VerifiersEnv(*manifest_for(f"vf:{write_module(tmp_path, name, source)}"))
        [count] = [t for t in env.load_tasks() if t.id == "count"]
        verdict = asyncio.run(env._controlled(count, REWARD_RAISED, "ValueError: many"))
        assert verdict.outcome == 0.0
        if broken:
            assert "gold answer fails the same way" in str(verdict.env_failure)
        else:
            assert verdict.env_failure is None and verdict.signals[0].name == UNGRADABLE
            assert verdict.info["control"] == "the task's gold answer passes"
        assert asyncio.run(env.control(count)) == ({REWARD_RAISED} if broken else set())


# A taskset whose task serves an MCP toolset: verifiers would run it on this machine.
TOOLSET = CAPITALS.replace("class CapitalTask(vf.Task[Question, vf.State]):", '''
class Lookup(vf.Toolset):
    @vf.tool
    async def lookup(self, name: str) -> str:
        return name


class CapitalTask(vf.Task[Question, vf.State]):
    @classmethod
    def toolsets(cls, config):
        return [Lookup(vf.ToolsetConfig())]
''')


def test_toolsets_are_refused_at_load(tmp_path):
    require_verifiers()
    module = write_module(tmp_path, "tools", TOOLSET)
    with pytest.raises(process.VerifiersUnsupported, match="toolsets Lookup would run unsandboxed"):
        load_env(f"vf:{module}")


def test_scores_come_from_the_taskset_as_loaded(tmp_path):
    """The taskset's source is copied when its tasks are loaded: a rewrite of the module
    afterwards (say, by a tool) changes nothing that grades."""
    require_verifiers()
    module = write_module(tmp_path, "capitals", CAPITALS)
    env = VerifiersEnv(*manifest_for(f"vf:{module}"))
    [paris] = [t for t in env.load_tasks() if t.id == "paris"]
    module.write_text(CAPITALS.replace("return float(trace.last_reply.strip().lower() == "
                                       "task.answer.lower())", "return 0.0"))
    ctx = _ctx(tmp_path)
    asyncio.run(env.solve(paris, None, ctx))  # type: ignore[arg-type]
    verdict = asyncio.run(env.verify(paris, None, ctx))  # type: ignore[arg-type]
    assert verdict.outcome == 1.0, verdict
