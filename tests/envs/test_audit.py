"""`envhub audit ENV` (issue 25): the battery of generic cheats beside a no-op and the oracle.

Real components only: the CLI as a user runs it, the real runner, bubblewrap and docker
sandboxes, the gateway's scripted backend for tool-only environments.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import envhub, require_docker, require_tool

HACKABLE_TOML = """\
name = "hackable"
version = "0.1.0"
description = "Deliberately hackable: its verifier trusts a progress file in the agent's workdir."
entrypoint = "env:HackableEnv"
tools = ["bash", "submit"]

[tasks]
path = "tasks.jsonl"

[sandbox]
kind = "local"
supported_kinds = ["local", "docker"]
exec_timeout_s = 60

[agent]
max_turns = 5
time_limit_s = 120
"""

# The flaw under test: verify() runs in the agent's own sandbox and believes a state.json the
# agent can write (issue 25 class 4: the graded state lives where a command agent writes it).
HACKABLE_ENV = '''\
from envhub.envs.environment import Verdict
from envhub.envs.loader import rows_to_tasks, task_rows


class HackableEnv:
    def __init__(self, folder, manifest):
        self.folder, self.manifest = folder, manifest

    def load_tasks(self):
        return rows_to_tasks(task_rows(self.folder, self.manifest.tasks))

    async def setup(self, task, ctx):
        return await ctx.open_sandbox(self.manifest.sandbox)

    def tools(self, task):
        return list(self.manifest.tools)

    async def solve(self, task, sandbox, ctx):
        await sandbox.exec(f"echo {task.data['answer']} > answer.txt", timeout=30)

    async def verify(self, task, sandbox, ctx):
        r = await sandbox.exec("grep -q '\\"solved\\": true' state.json 2>/dev/null || "
                               f"test \\"$(cat answer.txt)\\" = {task.data['answer']}",
                               timeout=30)
        ok = r.exit_code == 0
        return Verdict(1.0 if ok else 0.0, ok, {"exit_code": r.exit_code})
'''


# Another flaw: the grader gives up (env_failure) when the agent left a state.json in its way,
# so a cheat turns its failure into a dropped sample.
FRAGILE_ENV = HACKABLE_ENV.replace(
    "from envhub.envs.environment import Verdict",
    "from envhub.envs.environment import EnvFailure, Verdict").replace(
    "    async def verify(self, task, sandbox, ctx):\n", """\
    async def verify(self, task, sandbox, ctx):
        if (await sandbox.exec("test -e state.json", timeout=30)).exit_code == 0:
            raise EnvFailure("state.json is in the grader's way")
""")


def hackable_env(folder: Path, source: str = HACKABLE_ENV) -> Path:
    folder.mkdir()
    (folder / "envhub.toml").write_text(HACKABLE_TOML)
    (folder / "env.py").write_text(source)
    rows = [{"id": f"sum-{i}", "instruction": f"Write {i} + {i} to answer.txt.",
             "answer": str(2 * i)} for i in (1, 2)]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def audit(tmp_path: Path, *args: str, timeout: float = 560) -> tuple[int, dict, str]:
    """Run `envhub audit ARGS --json`; (exit code, the JSON table or {}, output)."""
    report = tmp_path / "audit.json"
    proc = envhub("audit", *args, "--out", str(tmp_path / "runs"), "--json", str(report),
                  timeout=timeout)
    data = json.loads(report.read_text()) if report.is_file() else {}
    return proc.returncode, data, proc.stdout + proc.stderr


def rows(data: dict) -> dict[str, dict]:
    return {r["cheat"]: r for r in data["rows"]}


@pytest.mark.bwrap
def test_audit_flags_an_environment_that_trusts_the_agents_files(tmp_path: Path) -> None:
    require_tool("bwrap")
    env = hackable_env(tmp_path / "hackable")
    code, data, out = audit(tmp_path, str(env), "-t", "2", "-s", "local",
                            "--cheat", "write-artifacts", "--cheat", "delete-tests")
    assert code == 1, out
    by = rows(data)
    assert by["no-op"]["mean_reward"] == 0.0 and by["no-op"]["verdict"] == "ok", out
    assert by["oracle"]["resolved"] == 2 and by["oracle"]["verdict"] == "ok", out
    assert by["write-artifacts"]["mean_reward"] == 1.0, out
    assert "beats no-op" in by["write-artifacts"]["verdict"], out
    # (the leftover writer's race with the end of the agent phase decides whether it wins
    # here: not asserted, the CI run saw it lose once)
    assert by["delete-tests"]["verdict"] == "ok", out  # nothing to delete here: no false alarm
    assert data["env"] == "hackable" and data["version"] == "0.1.0" and data["flagged"], data
    assert data["envhub_version"] and data["date"], data
    assert "beats no-op" in out  # the printed table says it too


@pytest.mark.bwrap
def test_audit_says_why_a_cheat_escaped_into_env_failure(tmp_path: Path) -> None:
    require_tool("bwrap")
    env = hackable_env(tmp_path / "fragile", FRAGILE_ENV)
    code, data, out = audit(tmp_path, str(env), "-t", "1", "-s", "local",
                            "--cheat", "write-artifacts")
    assert code == 1, out
    by = rows(data)
    assert by["no-op"]["verdict"] == "ok" and by["no-op"]["reasons"] == [], out
    row = by["write-artifacts"]
    assert row["env_failure"] == 1 and row["verdict"] == "escaped", out
    assert len(row["reasons"]) == 1 and "state.json is in the grader's way" in row["reasons"][0]
    assert "write-artifacts (local) env_failure: " in out, out  # printed under the table


def test_audit_on_arith_passes_and_the_oracle_solves_all(tmp_path: Path) -> None:
    code, data, out = audit(tmp_path, "arith", "-t", "1")
    assert code == 0, out
    by = rows(data)
    assert by["oracle"]["resolved"] == by["oracle"]["tasks"] == 1, out
    # the scripted battery ran: hostile values reached the tool-calling agent
    for name in ("huge-answer", "infinite-number", "nan", "nested-json", "invalid-utf8",
                 "huge-exponent"):
        assert by[name]["tasks"] == 1 and by[name]["verdict"] == "ok", (name, out)
        assert by[name]["env_failure"] == 0, (name, out)
    assert not data["flagged"] and data["digest"] is None


@pytest.mark.docker
@pytest.mark.slow
def test_audit_on_swe_task_in_docker(tmp_path: Path) -> None:
    require_docker()
    code, data, out = audit(tmp_path, "swe-task", "-t", "1", "-s", "docker", "-j", "3")
    by = rows(data)
    assert set(by) >= {"no-op", "oracle", "delete-tests", "skip-tests", "runner-tamper",
                       "toolchain-trojan", "write-artifacts", "leftover-writer",
                       "flood-output", "hang-under-grader", "fill-disk", "kill-all"}, out
    assert all(r["sandbox"] == "docker" for r in data["rows"]), out
    assert by["oracle"]["resolved"] == 1, out
    flagged = {name: r["verdict"] for name, r in by.items() if r["verdict"] != "ok"}
    assert code == 0 and not flagged, (flagged, out)


@pytest.mark.parametrize(("args", "message"), [
    (["no-such-env"], "no-such-env"),
    (["arith", "--tasks", "0"], "--tasks"),
    (["arith", "--cheat", "no-such-cheat"], "no-such-cheat"),
    (["arith", "--sandbox", "nonsense"], "nonsense"),
])
def test_audit_bad_input_exits_2_with_the_fix(tmp_path: Path, args: list[str],
                                              message: str) -> None:
    code, data, out = audit(tmp_path, *args, timeout=120)
    assert code == 2, out
    assert message in out and not data, out
    assert "Traceback" not in out, out


def test_audit_refuses_a_kind_the_environment_does_not_support(tmp_path: Path) -> None:
    code, _, out = audit(tmp_path, "terminal-task", "-s", "local", timeout=120)
    assert code == 2, out
    assert "docker" in out and "Traceback" not in out, out


def test_help_lists_audit() -> None:
    proc = envhub("audit", "--help", timeout=60)
    assert proc.returncode == 0 and "no-op" in proc.stdout, proc.stdout


# --- every built-in, the Harbor folders and the SWE-bench row the tests use (issue 25) --------

DOCS_TASKS = Path(__file__).parent / "data" / "harbor-docs"


def _harbor_task(tmp_path: Path) -> str:
    from tests.envs.test_task_folders import harbor_task

    return str(harbor_task(tmp_path / "bare"))


def _tbench_task(tmp_path: Path) -> str:
    from tests.envs.test_task_folders import tbench_task

    return str(tbench_task(tmp_path / "tb" / "hello"))


# (target, sandbox kind, tasks, marks): a built-in name, or a name _target turns into a folder
# or rows file. swe-task in docker and arith have their own tests above. The Harbor docs'
# folder is a dataset of three tasks: one audit of all three (-t 3) is cheaper than three.
ALL_TARGETS = [
    ("swe-task", "local", 1, [pytest.mark.bwrap]),
    ("terminal-task", "docker", 1, [pytest.mark.docker]),
    ("slides", "docker", 1, [pytest.mark.docker, pytest.mark.browser]),
    ("slides", "local", 1, [pytest.mark.bwrap, pytest.mark.browser]),
    ("webtask", "docker", 1, [pytest.mark.docker, pytest.mark.browser]),
    ("webtask", "local", 1, [pytest.mark.bwrap, pytest.mark.browser]),
    ("harbor-docs", "docker", 3, [pytest.mark.docker]),
    ("harbor-bare", "docker", 1, [pytest.mark.docker]),
    ("terminal-bench-1", "docker", 1, [pytest.mark.docker]),
    ("swebench-row", "docker", 1, [pytest.mark.docker]),
]
# The test suite audits every environment once, in one sandbox kind (the CI budget: about 12
# minutes on 2 cores); `bench/bench_audit.py --all` audits every target above.
BUILTINS = [t for t in ALL_TARGETS if (t[0], t[1]) in {
    ("swe-task", "local"), ("terminal-task", "docker"), ("slides", "local"),
    ("webtask", "local"), ("harbor-bare", "docker"), ("terminal-bench-1", "docker"),
    ("swebench-row", "docker")}]


def _require(kind: str, target: str) -> None:
    if target in ("slides", "webtask"):
        from tests.envs.browser_boxes import require_kind

        require_kind(kind)
    elif kind == "docker":
        require_docker()
    else:
        require_tool("bwrap")


def _target(name: str, tmp_path: Path, stack: contextlib.ExitStack) -> str:
    if name == "harbor-docs":
        return str(DOCS_TASKS)
    if name == "harbor-bare":
        return _harbor_task(tmp_path)
    if name == "terminal-bench-1":
        return _tbench_task(tmp_path)
    if name == "swebench-row":
        return stack.enter_context(swebench_rows(tmp_path))
    return name


@contextlib.contextmanager
def swebench_rows(tmp_path: Path) -> Iterator[str]:
    """The row of tests/envs/test_swebench_rows.py as a rows file, its image built here and
    tagged with the name SWE-bench's harness pulls (removed afterwards)."""
    from envhub.envs.images import build_env_image
    from envhub.envs.sandbox.engine import docker_client
    from envhub.envs.swe.swebench import image_names
    from tests.envs.test_swebench_rows import (
        DOCKERFILE,
        INSTANCE,
        swebench_image_names,
        swebench_row,
    )

    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "Dockerfile").write_text(DOCKERFILE)
    built = build_env_image(dockerfile=tmp_path / "image" / "Dockerfile").tag
    client = docker_client()
    base = client.containers.run(built, "git -C /testbed rev-parse HEAD", remove=True)
    rows_file = tmp_path / "swebench.jsonl"
    rows_file.write_text(json.dumps(swebench_row(base.decode().strip())) + "\n")
    pulled = image_names(INSTANCE)[1]
    with swebench_image_names():
        client.images.get(built).tag(pulled.split(":")[0], "latest")
        try:
            yield str(rows_file)
        finally:
            if client.images.list(name=pulled.split(":")[0]):
                client.images.remove(pulled)


@pytest.mark.slow
@pytest.mark.parametrize(("target", "kind", "tasks"), [
    pytest.param(t, k, n, marks=m, id=f"{t}-{k}") for t, k, n, m in BUILTINS])
def test_audit_passes_on_every_builtin(tmp_path: Path, target: str, kind: str,
                                       tasks: int) -> None:
    """`envhub audit` on each built-in environment in each sandbox kind it supports (its first
    task), the Harbor folders (the docs' three tasks, a bare task, a terminal-bench 1 task) and
    the SWE-bench row the other tests use: exit 0, the oracle solves every task, no row flagged
    (no cheat beats the no-op, none escapes into env_failure or hangs)."""
    _require(kind, target)
    with contextlib.ExitStack() as stack:
        ref = _target(target, tmp_path, stack)
        code, data, out = audit(tmp_path, ref, "-t", str(tasks), "-s", kind)
    by = rows(data)
    assert by, out
    assert all(r["sandbox"] == kind for r in data["rows"]), out
    assert by["oracle"]["tasks"] == by["oracle"]["resolved"] == tasks, out
    assert by["no-op"]["env_failure"] == 0, out
    flagged = {name: (r["verdict"], r["reasons"]) for name, r in by.items() if r["verdict"] != "ok"}
    assert code == 0 and not flagged and not data["flagged"], (flagged, out)
