"""Harbor grading runs where the agent never ran (issue 25, class 2): test.sh in a fresh
container of the task image holding only the task's declared artifacts.

Each toolchain trojan below is first shown to beat grading in the agent's own container (the
old way, run here as a control: reward 1 without doing the task), then scored 0 by the
environment's verify. Also: what travels (declared paths only, symlinks as links, no
start-up hooks), refusals with the reason, and who is blamed for what (env_failure vs 0 with
`ungradable_output`)."""

from __future__ import annotations

import asyncio
import io
import secrets
import tarfile
from pathlib import Path

import pytest

from envhub.envs.environment import UNGRADABLE, RunContext, Verdict
from envhub.envs.harbor import HarborTaskError, load_harbor_task, run_verifier
from envhub.envs.harbor.artifacts import Carried, _filter_blocking
from envhub.envs.harbor.artifacts import put_tree as put_tests
from envhub.envs.harbor.verifier import prepare, run_tests
from envhub.envs.loader import load_env
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox
from tests.support import require_docker

SITE = "/usr/local/lib/python3.11/dist-packages"
#: toolchain trojans: each makes test.sh pass on a task never attempted, when test.sh runs in
#: the container the agent used
TROJANS = {
    # class 2 as filed: a python3 first on PATH that passes anything under /tests
    "python3_shim": "printf '#!/bin/sh\\ncase \"$1\" in /tests/*) exit 0;; esac\\n"
                    "exec /usr/bin/python3 \"$@\"\\n' > /usr/local/bin/python3 && "
                    "chmod +x /usr/local/bin/python3",
    # class 2 as filed: a .pth that ends any script under /tests with status 0
    "pth_in_site_packages": f"mkdir -p {SITE} && echo 'import sys, os; "
                            "sys.argv[0].startswith(\"/tests/\") and os._exit(0)' "
                            f"> {SITE}/zz-grader.pth",
    # variants: sitecustomize.py, a bash first on PATH, the real interpreter replaced
    "sitecustomize": "printf 'import sys, os\\n"
                     "if sys.argv[0].startswith(\"/tests/\"): os._exit(0)\\n' "
                     "> /etc/python3.11/sitecustomize.py",  # Debian's, imported by every python3
    "bash_shim": "printf '#!/bin/sh\\nif [ \"$1\" = /tests/test.sh ]; then mkdir -p "
                 "/logs/verifier; echo 1 > /logs/verifier/reward.txt; exit 0; fi\\n"
                 "exec /bin/bash \"$@\"\\n' > /usr/local/bin/bash && chmod +x /usr/local/bin/bash",
    "python3_binary_replaced": "cp /usr/bin/python3.11 /usr/bin/python3-real && "
                               "rm /usr/bin/python3 && printf '#!/bin/sh\\ncase \"$1\" in "
                               "/tests/*) exit 0;; esac\\nexec /usr/bin/python3-real \"$@\"\\n' "
                               "> /usr/bin/python3 && chmod +x /usr/bin/python3",
}


class Harness:
    """The terminal-task environment on real docker, sandboxes closed after each rollout."""

    def __init__(self, scratch: Path, env_ref: str = "terminal-task") -> None:
        self.loaded = load_env(env_ref)
        self.env = self.loaded.env
        self.tasks = {t.id: t for t in self.env.load_tasks()}
        self.scratch = scratch
        self.opened: list[Sandbox] = []

    async def open(self, spec: SandboxSpec) -> Sandbox:
        box = await open_sandbox("docker", spec, run_id="test-harbor-fresh",
                                 package_root=self.loaded.folder)
        self.opened.append(box)
        return box

    def ctx(self) -> RunContext:
        return RunContext(run_id="test-harbor-fresh", sandbox_kind="docker",
                          open_sandbox=self.open, scratch=self.scratch)

    async def close(self) -> None:
        while self.opened:
            await self.opened.pop().close()

    def rollout(self, task_id: str, agent: str, control: bool = False
                ) -> tuple[Verdict, Verdict | None]:
        """Run `agent` (a shell command) in the task's sandbox, then the environment's verify;
        with `control`, also the old grading in the agent's own container (after verify)."""
        task = self.tasks[task_id]

        async def go() -> tuple[Verdict, Verdict | None]:
            try:
                sandbox = await self.env.setup(task, self.ctx())
                done = await sandbox.exec(agent, timeout=60, cwd="/")
                assert done.exit_code == 0, done.stderr
                await sandbox.end_processes()
                verdict = await self.env.verify(task, sandbox, self.ctx())
                old = await in_place(self.env.harbor_task(task), sandbox) if control else None
                return verdict, old
            finally:
                await self.close()
        return asyncio.run(go())


async def in_place(harbor, sandbox: Sandbox) -> Verdict:  # noqa: ANN001 - a HarborTask
    """The old grading: test.sh in the agent's own container, with every hardening it had
    (processes ended, reward folder emptied, start marker, the grader's PATH)."""
    marker = f"/logs/.envhub-verifier-{secrets.token_hex(8)}"
    await sandbox.end_processes()
    await prepare(sandbox, marker, "true")
    await put_tests(sandbox, harbor.tests_dir, "/tests")
    return await run_tests(harbor, sandbox, marker)


@pytest.mark.docker
@pytest.mark.parametrize("trojan", sorted(TROJANS))
def test_a_toolchain_trojan_scores_zero(tmp_path: Path, trojan: str) -> None:
    require_docker()
    verdict, old = Harness(tmp_path).rollout("envhub/word-frequency", TROJANS[trojan],
                                             control=True)
    assert old is not None and old.resolved, ("the trojan must beat in-place grading", old)
    assert verdict.env_failure is None, verdict.env_failure
    assert verdict.outcome == 0.0 and not verdict.resolved, verdict.info


def harbor_folder(root: Path, test_sh: str, toml: str = "", dockerfile: str = "") -> Path:
    """A one-task Harbor folder graded by `test_sh`."""
    folder = root / "task"
    for sub in ("environment", "tests", "solution"):
        (folder / sub).mkdir(parents=True)
    (folder / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 30\n'
                                      "[environment]\nallow_internet = false\n" + toml)
    (folder / "instruction.md").write_text("do it\n")
    (folder / "environment" / "Dockerfile").write_text(
        "FROM envhub/base\nWORKDIR /app\n" + dockerfile)
    (folder / "tests" / "test.sh").write_text(test_sh)
    (folder / "solution" / "solve.sh").write_text("true\n")
    return folder


@pytest.mark.docker
def test_only_the_declared_paths_travel_and_deletions_too(tmp_path: Path) -> None:
    """artifacts = ["/app/out"]: files the agent wrote elsewhere (in /app, /opt, /tmp) are not
    in the grader, a symlink travels as a link (to the grader's own file), a .pth and a
    __pycache__ inside the artifact path are dropped, a file the agent deleted stays deleted."""
    checks = {
        "out": "test \"$(cat /app/out/a.txt)\" = yes",
        "kept_deletion": "test ! -e /app/out/seed.txt",
        "not_beside": "test ! -e /app/notes.txt && test ! -e /opt/x && test ! -e /tmp/y",
        "link": "test -L /app/out/py && test \"$(readlink /app/out/py)\" = /usr/bin/python3",
        "no_hooks": "test ! -e /app/out/x.pth && test ! -e /app/out/__pycache__",
    }
    script = "".join(f'{k}=0; {v} && {k}=1\n' for k, v in checks.items())
    script += "printf '{" + ", ".join(f'"{k}": %s' for k in checks) + "}' " + " ".join(
        f"${k}" for k in checks) + " > /logs/verifier/reward.json\n"
    folder = harbor_folder(tmp_path, script, '[metadata.envhub]\nartifacts = ["/app/out"]\n',
                           "RUN mkdir -p /app/out && echo seed > /app/out/seed.txt\n")
    agent = ("echo yes > /app/out/a.txt && rm /app/out/seed.txt && echo n > /app/notes.txt && "
             "mkdir -p /opt /app/out/__pycache__ && echo x > /opt/x && echo y > /tmp/y && "
             "ln -s /usr/bin/python3 /app/out/py && echo 'import os' > /app/out/x.pth && "
             "echo z > /app/out/__pycache__/m.cpython-311.pyc")
    harness = Harness(tmp_path, str(folder))
    verdict, _ = harness.rollout("task", agent)
    assert verdict.env_failure is None, verdict.env_failure
    assert verdict.info["rewards"] == {k: 1.0 for k in checks}, verdict.info
    dropped = " ".join(verdict.info["artifacts"]["dropped"])
    assert "x.pth" in dropped and "__pycache__" in dropped


@pytest.mark.docker
def test_output_past_the_cap_is_zero_with_the_signal(tmp_path: Path) -> None:
    folder = harbor_folder(tmp_path, "echo 1 > /logs/verifier/reward.txt\n",
                           "[metadata.envhub]\nartifacts_max_mb = 1\n")
    verdict, _ = Harness(tmp_path, str(folder)).rollout(
        "task", "head -c 3000000 /dev/urandom > /app/big.bin")
    assert verdict.env_failure is None and verdict.outcome == 0.0, verdict
    assert [s.name for s in verdict.signals] == [UNGRADABLE]
    assert "too large to grade" in verdict.info["ungradable"]


@pytest.mark.docker
def test_a_hang_caused_by_the_output_is_zero_and_one_of_the_task_is_env_failure(
        tmp_path: Path) -> None:
    """test.sh times out: on the agent's output only (the pristine image finishes) it is 0
    with `ungradable_output`; when the pristine image times out too it is env_failure."""
    runs = "timeout_sec = 3\n"
    hangs_on_output = harbor_folder(tmp_path / "a", "python3 /app/run.py; echo 0 > "
                                    "/logs/verifier/reward.txt\n")
    (hangs_on_output / "task.toml").write_text(
        (hangs_on_output / "task.toml").read_text().replace("timeout_sec = 30\n", runs))
    verdict, _ = Harness(tmp_path, str(hangs_on_output)).rollout(
        "task", "echo 'while True: pass' > /app/run.py")
    assert verdict.env_failure is None and verdict.outcome == 0.0, verdict
    assert [s.name for s in verdict.signals] == [UNGRADABLE]
    assert verdict.info.get("pristine_finished") is True
    assert verdict.info["grader_retries"] == 1  # it hung in a second fresh grader too

    always_hangs = harbor_folder(tmp_path / "b", "sleep 600\n")
    (always_hangs / "task.toml").write_text(
        (always_hangs / "task.toml").read_text().replace("timeout_sec = 30\n", runs))
    verdict, _ = Harness(tmp_path, str(always_hangs)).rollout("task", "true")
    assert verdict.env_failure and "pristine task image too" in verdict.env_failure


@pytest.mark.docker
def test_artifacts_on_a_search_path_of_the_image_are_refused_with_the_reason(
        tmp_path: Path) -> None:
    folder = harbor_folder(tmp_path, "echo 1 > /logs/verifier/reward.txt\n",
                           dockerfile="ENV PYTHONPATH=/app/lib\n")
    verdict, _ = Harness(tmp_path, str(folder)).rollout("task", "true")
    assert verdict.env_failure and "cannot be graded in a fresh container" in \
        verdict.env_failure and "PYTHONPATH" in verdict.env_failure


@pytest.mark.docker
def test_a_grader_that_cannot_start_is_env_failure(tmp_path: Path) -> None:
    require_docker()
    harness = Harness(tmp_path)
    task = harness.tasks["envhub/word-frequency"]
    harbor = harness.env.harbor_task(task)

    async def go() -> Verdict:
        try:
            sandbox = await harness.env.setup(task, harness.ctx())
            return await run_verifier(harbor, sandbox, lambda: harness.open(
                SandboxSpec(image="envhub/no-such-grader-image:0")))
        finally:
            await harness.close()
    verdict = asyncio.run(go())
    assert verdict.env_failure and "grader container did not start" in verdict.env_failure


@pytest.mark.parametrize("toml,dockerfile,match", [
    ("", "FROM envhub/base\n", r"'/' overlaps /.*cannot be graded that way"),
    ('[metadata.envhub]\nartifacts = ["/usr/local"]\n', "", "overlaps /usr"),
    ('[metadata.envhub]\nartifacts = ["/app", "/etc/app.conf"]\n', "", "overlaps /etc"),
    ('[metadata.envhub]\nartifacts = ["out"]\n', "", "not an absolute path"),
    ('[metadata.envhub]\nartifacts = ["/logs"]\n', "", "overlaps /logs"),
])
def test_tasks_that_cannot_be_graded_fresh_are_refused_at_load(
        tmp_path: Path, toml: str, dockerfile: str, match: str) -> None:
    folder = harbor_folder(tmp_path, "true\n", toml)
    if dockerfile:
        (folder / "environment" / "Dockerfile").write_text(dockerfile)
    with pytest.raises(HarborTaskError, match=match):
        load_harbor_task(folder)


def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return buffer


def _member(name: str, kind: bytes = tarfile.REGTYPE, data: bytes = b"",
            link: str = "", mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, mode
    if kind == tarfile.REGTYPE:
        info.size = len(data)
        return info, data
    return info, None


def test_a_crafted_archive_cannot_reach_outside_the_declared_path() -> None:
    """What the engine's archive of the agent's path may hold, and what of it travels: links
    kept as links and nothing below them, nothing outside the root, no devices, no hooks, no
    setuid bits, hard links only to files carried."""
    raw = _tar(
        _member("app", tarfile.DIRTYPE, mode=0o755),
        _member("app/ok.txt", data=b"fine", mode=0o4755),
        _member("app/bin", tarfile.SYMTYPE, link="/usr/local/bin"),
        _member("app/bin/python3", data=b"#!/bin/sh\nexit 0\n"),
        _member("app/../etc/passwd", data=b"x"),
        _member("other/x", data=b"x"),
        _member("app/null", tarfile.CHRTYPE),
        _member("app/zz.pth", data=b"import os"),
        _member("app/pkg/sitecustomize.py", data=b"import os"),
        _member("app/same", tarfile.LNKTYPE, link="app/ok.txt"),
        _member("app/passwd", tarfile.LNKTYPE, link="etc/passwd"),
    )
    out, carried = io.BytesIO(), Carried()
    _filter_blocking(raw, out, "app", 1 << 20, carried)
    with tarfile.open(fileobj=out) as tar:
        kept = {m.name: m for m in tar.getmembers()}
    assert sorted(kept) == ["app", "app/bin", "app/ok.txt", "app/same"]
    assert kept["app/bin"].issym() and kept["app/ok.txt"].mode == 0o755
    reasons = " ".join(carried.dropped)
    for name in ("app/bin/python3 (below a symlink)", "other/x (outside",
                 "app/null (not a file", "app/zz.pth (interpreter", "app/passwd (hard link"):
        assert name in reasons, reasons


@pytest.mark.docker
@pytest.mark.parametrize("agent", ["rm -rf /app", "rm -rf /app && ln -s /usr/local/bin /app",
                                   "chmod 000 /app/data/text.txt && chattr +i /app 2>/dev/null;"
                                   " mkfifo /app/pipe && true"])
def test_a_mangled_workdir_is_graded_as_it_is(tmp_path: Path, agent: str) -> None:
    """The WORKDIR removed, replaced by a link into the toolchain, or holding a fifo and an
    unreadable file: graded as it is (0), never env_failure, never the agent's toolchain."""
    require_docker()
    verdict, _ = Harness(tmp_path).rollout("envhub/word-frequency", agent)
    assert verdict.env_failure is None, verdict.env_failure
    assert verdict.outcome == 0.0, verdict.info


#: server.py forks a daemon that turns a 0 in reward.txt into 1 as soon as test.sh writes it
FLIPPER = r'''
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        end = time.time() + 60
        while time.time() < end:
            try:
                if open("/logs/verifier/reward.txt").read().strip() == "0":
                    open("/logs/verifier/reward.txt", "w").write("1\n")
            except OSError:
                pass
            time.sleep(0.0005)
    os._exit(0)
sys.exit(1)
'''


@pytest.mark.docker
def test_code_the_tests_run_cannot_rewrite_the_reward(tmp_path: Path) -> None:
    """The agent's server.py, started by fix-adder-service's check, leaves a daemon rewriting
    reward.txt from 0 to 1. It scored 1 (3/3) while checks ran the agent's code as root; the
    bundled checks now run it as nobody, who cannot write /logs/verifier."""
    require_docker()
    verdict, _ = Harness(tmp_path).rollout(
        "envhub/fix-adder-service", f"cat > /app/server.py <<'PY'\n{FLIPPER}PY\n")
    assert verdict.env_failure is None, verdict.env_failure
    assert verdict.outcome == 0.0, verdict.info


@pytest.mark.docker
def test_a_huge_sparse_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """1 GiB that costs the agent nothing (a sparse file) against the default 256 MiB cap: 0
    with `ungradable_output`, stopped at the file's header, not after streaming it."""
    require_docker()
    verdict, _ = Harness(tmp_path).rollout("envhub/word-frequency",
                                           "truncate -s 1G /app/huge.bin")
    assert verdict.env_failure is None and verdict.outcome == 0.0, verdict
    assert [s.name for s in verdict.signals] == [UNGRADABLE]
    assert verdict.info["verifier_s"] < 30, verdict.info
