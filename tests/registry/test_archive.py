"""`envhub pack`: deterministic archives, exclusions, validation at pack time."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

import pytest

from envhub.registry.archive import FIXED_MTIME, pack
from envhub.registry.errors import BadPackage, TooLarge
from envhub.registry.limits import Limits
from tests.registry.conftest import make_env, tree


def test_same_content_gives_same_bytes(tmp_path: Path) -> None:
    a = make_env(tmp_path / "a")
    b = make_env(tmp_path / "b")
    # Different mtimes, permissions and creation order must not change the archive.
    os.utime(b / "env.py", (1, 1))
    os.chmod(b / "tasks.jsonl", 0o600)
    (a / "sub").mkdir()
    (a / "sub" / "z.txt").write_text("z")
    (b / "sub").mkdir()
    (b / "sub" / "z.txt").write_text("z")
    pa, pb = pack(a, tmp_path / "out-a"), pack(b, tmp_path / "out-b")
    assert pa.path.read_bytes() == pb.path.read_bytes()
    assert pa.digest == pb.digest and pa.digest.startswith("sha256:")
    (b / "env.py").write_text("changed")
    assert pack(b, tmp_path / "out-c").digest != pa.digest


def test_entries_are_sorted_and_normalized(tmp_path: Path) -> None:
    env = make_env(tmp_path / "env")
    (env / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(env / "run.sh", 0o700)
    for junk in (".git", "__pycache__", ".venv", "node_modules", ".pytest_cache"):
        (env / junk).mkdir()
        (env / junk / "f").write_text("junk")
    (env / "mod.pyc").write_bytes(b"junk")
    packed = pack(env)
    assert packed.path.parent == env / "dist"
    with tarfile.open(packed.path) as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names) == ["env.py", "envhub.toml", "run.sh", "tasks.jsonl"]
    for m in members:
        assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (FIXED_MTIME, 0, 0, "", "")
    modes = {m.name: m.mode for m in members}
    assert modes["run.sh"] == 0o755 and modes["env.py"] == 0o644
    # Packing again (dist/ now exists inside the folder) gives the same archive.
    assert pack(env).digest == packed.digest


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda d: (d / "envhub.toml").write_text("name = [oops"), "not valid TOML"),
    (lambda d: (d / "envhub.toml").write_text('name = "x"\nversion = "1.0"\n'
                                              'entrypoint = "env:TinyEnv"\n'), "version"),
    (lambda d: (d / "envhub.toml").unlink(), "envhub.toml: missing"),
    (lambda d: (d / "env.py").unlink(), "entrypoint 'env:TinyEnv'"),
    (lambda d: (d / "tasks.jsonl").unlink(), "tasks.path"),
    (lambda d: (d / "envhub.toml").write_text(
        (d / "envhub.toml").read_text().replace(
            "[tasks]", 'dependencies = ["not a requirement!!"]\n[tasks]')), "pip requirement"),
    (lambda d: (d / "link").symlink_to("/etc/passwd"), "symlink"),
    (lambda d: os.mkfifo(d / "pipe"), "FIFO"),
])
def test_bad_folders_are_refused_and_leave_nothing(tmp_path: Path, mutate, match: str) -> None:
    env = make_env(tmp_path / "env")
    mutate(env)
    before = tree(env)
    with pytest.raises(BadPackage, match=match):
        pack(env, tmp_path / "out")
    assert tree(env) == before
    assert tree(tmp_path / "out") == set()


def test_size_limits_at_pack_time(tmp_path: Path) -> None:
    env = make_env(tmp_path / "env")
    (env / "big.bin").write_bytes(os.urandom(300_000))
    with pytest.raises(TooLarge, match="per file"):
        pack(env, tmp_path / "o1", Limits(max_file_bytes=200_000))
    with pytest.raises(TooLarge, match="package limit"):
        pack(env, tmp_path / "o2", Limits(max_total_bytes=200_000))
    with pytest.raises(TooLarge, match="compressed"):
        pack(env, tmp_path / "o3", Limits(max_archive_bytes=100_000))
    assert tree(tmp_path / "o3") == set()
