"""The embedded local registry: init → pack → publish → install, immutability, yanking,
`resolve()` for `envhub run`, `installed()` and `registry_info()` for `list` / `info`."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub.cli import app
from envhub.registry.install import installed, registry_info, resolve
from tests.registry.conftest import make_env, tree

runner = CliRunner()


def cli(*args: str) -> tuple[int, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.output


def test_round_trip_local(home: Path, tmp_path: Path) -> None:
    env = make_env(tmp_path / "my-env")
    code, out = cli("pack", str(env))
    assert code == 0, out
    archive, digest = out.split()[0], out.split()[1]
    assert Path(archive).is_file() and digest.startswith("sha256:")

    code, out = cli("publish", str(env), "--no-audit", "--owner", "alice")
    assert code == 0, out
    assert "alice/my-env@1.2.0 published to local" in out and digest in out

    code, out = cli("search", "tiny")
    assert code == 0 and "alice/my-env@1.2.0" in out

    code, out = cli("install", "alice/my-env@1.2.0")
    assert code == 0, out
    folder = home / "envs" / "alice" / "my-env" / "1.2.0"
    assert (folder / "env.py").read_text() == (env / "env.py").read_text()
    assert (folder / "tasks.jsonl").is_file()

    # resolve() is what `envhub run alice/my-env@1.2.0` calls: the folder, loadable.
    path = resolve("alice/my-env@1.2.0")
    assert path == folder
    spec = importlib.util.spec_from_file_location("installed_env", path / "env.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.TinyEnv.VERSION == "1.2.0"

    [entry] = installed()
    assert (entry.ref, entry.digest, entry.source) == ("alice/my-env@1.2.0", digest, "local")
    info = registry_info("alice/my-env")
    assert info is not None and info["latest"] == "1.2.0"
    assert info["installed"][0]["path"] == str(folder)
    assert registry_info("alice/unknown") is None
    assert registry_info("not-a-registry-name") is None


def test_versions_are_immutable_and_republish_is_idempotent(home: Path, tmp_path: Path) -> None:
    env = make_env(tmp_path / "env")
    assert cli("publish", str(env), "--no-audit", "--owner", "alice")[0] == 0
    code, out = cli("publish", str(env), "--no-audit", "--owner", "alice")
    assert code == 0 and "already published (same content)" in out
    (env / "env.py").write_text("class TinyEnv:\n    VERSION = 'sneaky'\n")
    blobs_before = tree(home / "registry" / "blobs")
    code, out = cli("publish", str(env), "--no-audit", "--owner", "alice")
    assert code == 2
    assert "already published with different content" in out and "bump 'version'" in out
    assert tree(home / "registry" / "blobs") == blobs_before


def test_yanked_versions_skip_ranges_but_install_exactly(home: Path, tmp_path: Path) -> None:
    for version in ("1.0.0", "1.1.0"):
        env = make_env(tmp_path / version, version=version)
        assert cli("publish", str(env), "--no-audit", "--owner", "alice")[0] == 0
    code, out = cli("yank", "alice/my-env@1.1.0")
    assert code == 0 and "yanked" in out
    assert resolve("alice/my-env@^1.0.0").name == "1.0.0"
    assert resolve("alice/my-env").name == "1.0.0"  # latest skips the yanked 1.1.0
    assert resolve("alice/my-env@1.1.0").name == "1.1.0"  # exact pins still install
    code, out = cli("yank", "alice/my-env@1.1.0", "--undo")
    assert code == 0 and "un-yanked" in out
    info = registry_info("alice/my-env")
    assert info is not None and info["latest"] == "1.1.0"
    code, out = cli("yank", "alice/my-env@^1.0.0")
    assert code == 2 and "exact version" in out


def test_exact_installed_versions_resolve_offline(home: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    env = make_env(tmp_path / "env")
    assert cli("publish", str(env), "--no-audit", "--owner", "alice")[0] == 0
    path = resolve("alice/my-env@1.2.0")
    # Point the default registry at a closed port: an exact installed pin must not care.
    monkeypatch.setenv("ENVHUB_REGISTRY", "http://127.0.0.1:9")
    assert resolve("alice/my-env@1.2.0") == path
    from envhub.registry.errors import Unavailable

    with pytest.raises(Unavailable, match="cannot reach the registry"):
        resolve("alice/my-env@^1.0.0")


def test_publish_accepts_a_packed_archive(home: Path, tmp_path: Path) -> None:
    env = make_env(tmp_path / "env", extra='[metadata]\nowner = "carol"')
    code, out = cli("pack", str(env), "--out", str(tmp_path / "dist"))
    assert code == 0
    code, out = cli("publish", str(tmp_path / "dist" / "my-env-1.2.0.tar.gz"), "--no-audit")
    assert code == 0 and "carol/my-env@1.2.0" in out  # owner from manifest metadata


def test_scaffolded_env_round_trip(home: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`envhub init` output packs, publishes and installs unchanged."""
    monkeypatch.chdir(tmp_path)
    code, out = cli("init", "scaffolded")
    assert code == 0, out
    code, out = cli("publish", "scaffolded", "--no-audit", "--owner", "bob")
    assert code == 0 and "bob/scaffolded@" in out, out
    code, out = cli("install", "bob/scaffolded")
    assert code == 0, out
    [entry] = installed()
    src = {p.relative_to(tmp_path / "scaffolded") for p in (tmp_path / "scaffolded").rglob("*")
           if "dist" not in p.parts}
    dst = {p.relative_to(entry.path) for p in entry.path.rglob("*")}
    assert src == dst - {Path(".envhub-install.json")}


def test_package_exports_are_lazy_and_complete() -> None:
    import subprocess
    import sys

    code = ("import sys, envhub.registry as r; assert 'sqlalchemy' not in sys.modules; "
            "assert all(callable(getattr(r, n)) for n in r.__all__); print(sorted(r.__all__))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert "resolve" in out.stdout and "installed" in out.stdout
