"""The local sandbox sees an allow-list of the host (envs/sandbox/host_view.py), under real
bubblewrap: copies of envhub's sources and task data placed anywhere else on the machine are
out of reach, declared host paths are visible read-only, and what tasks need still works."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox.errors import SandboxError
from envhub.envs.sandbox.host_view import ETC, SYSTEM
from envhub.envs.sandbox.local import LocalSandbox
from tests.support import require_tool

pytestmark = pytest.mark.bwrap

#: what the sandbox's own root may hold besides the allowed host entries
OWN = {"etc", "dev", "proc", "tmp", "run", "workspace"}


def run(coro):
    return asyncio.run(coro)


def sandbox_run(cmd: str, spec: SandboxSpec | None = None):
    require_tool("bwrap")

    async def go():
        box = await LocalSandbox.create(spec or SandboxSpec(exec_timeout_s=120), run_id="t-view")
        try:
            return await box.exec(cmd, timeout=120)
        finally:
            await box.close()

    return run(go())


def builtin_data() -> Path:
    import envhub.envs

    return Path(envhub.envs.__file__).resolve().parent / "builtin"


@pytest.fixture
def copies() -> Iterator[list[Path]]:
    """The built-in environments (swe-task's gold patches, terminal-task's solutions) and the
    sandbox's sources, copied as a second checkout would be: under /tmp, $HOME and /var/tmp."""
    made = []
    for parent in (Path(tempfile.gettempdir()), Path.home(), Path("/var/tmp")):
        if not parent.is_dir():
            continue
        root = Path(tempfile.mkdtemp(prefix="envhub-copy-", dir=parent))
        shutil.copytree(builtin_data(), root / "envs" / "builtin")
        shutil.copytree(builtin_data().parent / "sandbox", root / "envs" / "sandbox",
                        ignore=shutil.ignore_patterns("__pycache__"))
        made.append(root)
    yield made
    for root in made:
        shutil.rmtree(root, ignore_errors=True)


def test_copies_of_envhub_elsewhere_on_the_host_are_unreadable(copies: list[Path]) -> None:
    tasks = [root / "envs/builtin/swe_task/data/tasks.jsonl" for root in copies]
    assert all(t.is_file() for t in tasks)
    probes = [f"cat {t} | head -c 100; ls {t.parents[2]}" for t in tasks]
    # and by search: nothing named like the task data anywhere the sandbox can see
    probes.append("find / -path /proc -prune -o -name tasks.jsonl -print -o "
                  "-name host_view.py -print")
    r = sandbox_run("; ".join(probes) + "; echo done")
    assert r.stdout == "done\n", r.stdout
    assert r.stderr.count("No such file or directory") == 2 * len(copies), r.stderr


def test_the_root_holds_only_the_allow_list() -> None:
    r = sandbox_run("ls -A /; echo ---; ls -A /etc")
    top, etc = (part.split() for part in r.stdout.split("---\n"))
    assert set(top) <= set(SYSTEM) | OWN, top
    assert "usr" in top
    allowed_etc = {pattern.split("/")[0] for pattern in ETC}
    assert {e for e in etc if not any(Path(e).match(p) for p in allowed_etc)} == set(), etc
    assert "shadow" not in etc and "resolv.conf" not in etc
    # ssl: certificates only, never the private keys folder
    assert sandbox_run("ls -A /etc/ssl").stdout.split() <= ["certs", "openssl.cnf"]


def test_what_tasks_need_still_works() -> None:
    """The system interpreter, git, coreutils, a writable /tmp and workdir; the root itself
    and every host folder are read-only."""
    r = sandbox_run("python3 -c 'import ssl, sqlite3, json; print(1 + 1)' && git init -q r && "
                    "cd r && git -c user.email=a@b -c user.name=a commit -q --allow-empty -m x "
                    "&& echo git-ok && echo t > /tmp/t && cat /tmp/t && id -un && "
                    "(touch /new || echo root-ro) && (touch /usr/new || echo usr-ro)")
    assert r.stdout == "2\ngit-ok\nt\nroot\nroot-ro\nusr-ro\n", (r.stdout, r.stderr)


@pytest.fixture
def declared() -> Iterator[Path]:
    """A prefix declared in `host_paths` (a toolchain or virtualenv under /opt, say) with a
    tool in it and an envhub installed in its site-packages."""
    root = Path(tempfile.mkdtemp(prefix="envhub-prefix-"))
    (root / "bin").mkdir()
    (root / "bin" / "tool").write_text("#!/bin/sh\necho tool-ran\n")
    (root / "bin" / "tool").chmod(0o755)
    site = root / "lib" / "python3.11" / "site-packages"
    shutil.copytree(builtin_data(), site / "envhub" / "envs" / "builtin")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def test_declared_host_paths_are_visible_read_only_without_envhub(declared: Path) -> None:
    site = declared / "lib" / "python3.11" / "site-packages"
    spec = SandboxSpec(host_paths=[str(declared)])
    r = sandbox_run(f"{declared}/bin/tool; (touch {declared}/x || echo ro); ls {site}; "
                    f"ls -A {site}/envhub | wc -l; "
                    f"cat {site}/envhub/envs/builtin/swe_task/data/tasks.jsonl", spec)
    assert r.stdout == "tool-ran\nro\nenvhub\n0\n", (r.stdout, r.stderr)
    assert not (declared / "x").exists()
    # without the declaration the prefix is not there at all
    assert sandbox_run(f"ls {declared}").exit_code != 0


def test_bad_host_paths_are_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="absolute path"):
        SandboxSpec(host_paths=["opt/tool"])
    with pytest.raises(ValidationError, match="absolute path"):
        SandboxSpec(host_paths=["/"])
    missing = f"/nonexistent-{uuid.uuid4().hex[:8]}"
    require_tool("bwrap")
    with pytest.raises(SandboxError, match="do not exist on this machine"):
        run(LocalSandbox.create(SandboxSpec(host_paths=[missing]), run_id="t-view"))
