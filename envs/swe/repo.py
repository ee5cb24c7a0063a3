"""The task repository inside a sandbox: build it, hand pytest to it, read the agent's diff.

No git objects beyond the base commit may be reachable by the agent (mining history for the
fix is a known reward hack): offline tasks are rebuilt from a snapshot as a single commit;
a prebuilt image's repository has its history cut (`cut_history`) before the agent starts.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from envhub.envs.environment import EnvFailure
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import FileTooLarge, SandboxFileError
from envhub.envs.swe.pylib import host_pylib
from envhub.envs.swe.task import SWETask

SCRIPTS = Path(__file__).resolve().parent / "scripts"
# Sandbox-side scratch, outside the repository (local sandboxes can only write /workspace).
SCRATCH = "/workspace/.envhub"
GIT = ("git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c safe.directory='*' "
       "-c core.quotepath=false")
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null",
           "GIT_TERMINAL_PROMPT": "0"}
MAX_DIFF_BYTES = 4 << 20


def commit_message(task: SWETask) -> str:
    return f"{task.repo} {task.version}".strip() + "\n"


async def build_repo(sandbox: Sandbox, task: SWETask, package_root: Path) -> str:
    """Rebuild an offline task's repository at `task.repo_dir`; returns the base commit.

    Raises EnvFailure when the result is not exactly `task.base_commit` (a damaged snapshot
    or a different git would make every verdict meaningless)."""
    assert task.source_archive, "build_repo needs a task with a source_archive"
    archive = package_root / task.source_archive
    if not archive.is_file():
        raise EnvFailure(f"{archive}: snapshot missing from the environment package; "
                         "reinstall it or rebuild with scripts/build_swe_tasks.py")
    src = f"{SCRATCH}/src"
    await sandbox.write_file(f"{src}/source.tar.gz", archive.read_bytes())
    await sandbox.write_file(f"{src}/source.patch", task.source_patch.encode())
    await sandbox.write_file(f"{src}/remove.txt", "\n".join(task.source_remove).encode() + b"\n")
    await sandbox.write_file(f"{src}/message.txt", commit_message(task).encode())
    await sandbox.write_file(f"{src}/setup_repo.sh", (SCRIPTS / "setup_repo.sh").read_bytes())
    result = await sandbox.exec(f"sh {src}/setup_repo.sh {shlex.quote(task.repo_dir)} {src} "
                                f"&& rm -rf {src}", timeout=120, env=GIT_ENV)
    head = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
    if result.exit_code != 0 or head != task.base_commit:
        raise EnvFailure(f"{task.instance_id}: building the repository gave commit {head!r}, "
                         f"expected {task.base_commit} (exit {result.exit_code}: "
                         f"{result.stderr.strip()[-500:]})")
    return head


async def cut_history(sandbox: Sandbox, task: SWETask) -> str:
    """Replace a prebuilt repository's history by one commit of its current files (no refs,
    reflogs, stashes or packs survive); returns the new base commit."""
    script = (f"cd {shlex.quote(task.repo_dir)} && rm -rf .git && "
              f"{GIT} -c init.defaultBranch=main init -q && {GIT} add -A && "
              f"{GIT} -c user.name=envhub -c user.email=envhub@localhost commit -q --no-verify "
              f"--allow-empty -m {shlex.quote(commit_message(task))} && {GIT} rev-parse HEAD")
    result = await sandbox.exec(script, timeout=300, env=GIT_ENV)
    if result.exit_code != 0:
        raise EnvFailure(f"{task.instance_id}: cutting git history in {task.repo_dir} failed: "
                         f"{result.stderr.strip()[-500:]}")
    return result.stdout.strip().splitlines()[-1]


async def agent_diff(sandbox: Sandbox, task: SWETask, base: str) -> tuple[str, str]:
    """(the agent's changes as a binary git diff against `base`, problem or "").

    New files count (`git add -A`); ignored files do not. A broken repository is the agent's
    doing, so it is reported as a problem (an empty diff), not an infrastructure failure."""
    out = f"{SCRATCH}/agent.diff"
    cmd = (f"mkdir -p {SCRATCH} && cd {shlex.quote(task.repo_dir)} && {GIT} add -A && "
           f"{GIT} diff --cached --binary --full-index --no-color --no-ext-diff --no-textconv "
           f"--no-renames {shlex.quote(base)} > {out}")
    result = await sandbox.exec(cmd, timeout=120, env=GIT_ENV)
    if result.timed_out or result.exit_code != 0:
        probe = await sandbox.exec("true", timeout=60)
        if probe.exit_code != 0:  # the sandbox runs nothing at all: not the agent's repository
            raise EnvFailure(f"{task.instance_id}: the sandbox cannot run commands to read the "
                             f"changes (exit {probe.exit_code}: {probe.stderr.strip()[-300:]})")
        return "", (f"could not read the changes (git exit {result.exit_code}: "
                    f"{result.stderr.strip()[-300:]})")
    # Written by the agent's own tools (a shim of theirs may write anything, or nothing): what
    # is there is the agent's output, read with the diff's cap.
    try:
        data = await sandbox.read_file(out, limit=MAX_DIFF_BYTES)
    except FileTooLarge:
        return "", f"the diff is over the {MAX_DIFF_BYTES} byte limit"
    except SandboxFileError as e:
        return "", f"could not read the changes: {e}"
    return data.decode("utf-8", errors="surrogateescape"), ""


async def pytest_env(sandbox: Sandbox, task: SWETask | None = None) -> dict[str, str]:
    """Env vars that make `python3 -m pytest` work in the sandbox, plus the timeout plugin.

    The plugin and (when needed) pytest live in SCRATCH, outside the repository. The probe
    runs after the task's shell setup (e.g. SWE-bench's conda env), as the tests will."""
    def probe_cmd(cmd: str) -> str:
        return task.in_shell(cmd) if task is not None else cmd

    plugin_dir = f"{SCRATCH}/plugins"
    await sandbox.write_file(f"{plugin_dir}/envhub_test_timeout.py",
                             (SCRIPTS / "envhub_test_timeout.py").read_bytes())
    paths = [plugin_dir]
    probe = await sandbox.exec(probe_cmd("python3 -c 'import pytest'"), timeout=60)
    if probe.exit_code != 0:
        await sandbox.upload(str(host_pylib()), f"{SCRATCH}/pylib")
        paths.append(f"{SCRATCH}/pylib")
        env = {"PYTHONPATH": ":".join(paths)}
        # A grader whose pytest cannot start would score every patch 0: an infra failure.
        check = await sandbox.exec(probe_cmd("python3 -c 'import pytest'"), timeout=60, env=env)
        if check.exit_code != 0:
            raise EnvFailure("the pytest handed to the sandbox does not import with its "
                             f"python3: {(check.stderr or check.stdout).strip()[-500:]}")
    return {"PYTHONPATH": ":".join(paths)}
