"""Expected CLI failures exit with code 2 and say what to fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from envhub.cli import app
from tests.registry.conftest import make_env

runner = CliRunner()


@pytest.mark.parametrize(("args", "needle"), [
    (["install", "not-a-ref"], "use owner/name@version"),
    (["install", "alice/my-env@1.2"], "1.2.0"),
    (["install", "alice/missing@1.0.0"], "`envhub search`"),
    (["install", "alice/x", "--registry", "ftp://nowhere"], "http://"),
    (["install", "alice/x", "--registry", "http://127.0.0.1:9"], "cannot reach the registry"),
    (["search", "x", "--registry", "http://127.0.0.1:9"], "envhub registry serve"),
    (["pack", "/nonexistent/folder"], "not a folder"),
    (["publish", "/nonexistent/folder"], "envhub.toml"),
    (["yank", "alice/my-env@1.0.0"], "does not exist"),
    (["login", "http://127.0.0.1:9", "--token", "t"], "cannot reach the registry"),
    (["publish", ".", "--owner", "Not Valid"], "owner 'Not Valid' is invalid"),
    (["install", "alice/x", "--require", "audited"], "takes 'verified'"),
    (["registry", "worker", "--data", "w", "--sandbox", "docker"], "--unjailed"),
    (["registry", "worker", "--data", "w", "--sandbox", "e2b"], "local or docker"),
    (["registry", "worker", "--data", "w"], "holds no registry"),
])
def test_exit_code_2_with_the_fix(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  args: list[str], needle: str) -> None:
    make_env(tmp_path / "cwd-env")
    monkeypatch.chdir(tmp_path / "cwd-env")
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert "Traceback" not in result.output


def test_bad_manifest_at_publish(home: Path, tmp_path: Path) -> None:
    env = make_env(tmp_path / "env")
    (env / "envhub.toml").write_text('name = "my-env"\nversion = "one"\nentrypoint = "env:X"\n')
    result = runner.invoke(app, ["publish", str(env), "--no-audit"])
    assert result.exit_code == 2
    assert "field 'version'" in result.output and "semantic version" in result.output


def test_corrupt_credentials_say_how_to_recover(home: Path, tmp_path: Path) -> None:
    (home / "credentials.json").write_text("{not json")
    result = runner.invoke(app, ["search"])
    assert result.exit_code == 2 and "envhub login" in result.output


def test_remote_publish_needs_an_owner_when_ambiguous(home: Path, tmp_path: Path) -> None:
    env = make_env(tmp_path / "env")
    result = runner.invoke(app, ["publish", str(env), "--no-audit",
                                 "--registry", "http://127.0.0.1:9"])
    assert result.exit_code == 2
    assert "--owner" in result.output


def test_serve_on_a_busy_port(home: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["registry", "serve", "--port", str(port), "--data",
                                     str(tmp_path / "data")])
    assert result.exit_code == 2 and "pick another --port" in result.output


def test_token_create_needs_valid_owners(tmp_path: Path) -> None:
    result = runner.invoke(app, ["registry", "token", "create", "--owner", "Bad Owner",
                                 "--data", str(tmp_path / "d")])
    assert result.exit_code == 2 and "owner 'Bad Owner' is invalid" in result.output
    result = runner.invoke(app, ["registry", "token", "create", "--data", str(tmp_path / "d")])
    assert result.exit_code == 2 and "--owner" in result.output
