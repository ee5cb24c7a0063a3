"""The public entry points: open_sandbox (incl. "auto"), best_available, reap, and the CLI."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import SandboxFileError, SandboxUnavailable, best_available, open_sandbox
from tests.support import docker_reachable, require_docker, require_tool


def run(coro):
    return asyncio.run(coro)


def cli() -> typer.Typer:
    from envhub.envs.images.cli import register as register_images
    from envhub.envs.sandbox.cli import register as register_sandbox

    app = typer.Typer()
    register_sandbox(app)
    register_images(app)
    return app


CUSTOM = "tests.envs.runtime_fixtures.custom_kind:FolderSandbox"


def test_unknown_kind_is_a_clear_error() -> None:
    with pytest.raises(SandboxUnavailable,
                       match="use one of docker, e2b, local, or the dotted path"):
        run(open_sandbox("vm", SandboxSpec()))
    with pytest.raises(SandboxUnavailable, match="No module named 'nowhere'"):
        run(open_sandbox("nowhere.box:Box", SandboxSpec()))


def test_every_consumer_reads_the_kinds_table() -> None:
    """open_sandbox, reap, the manifest, the run options and the CLI derive from one table;
    a dotted path is a kind too."""
    from envhub.envs.manifest import ManifestError, parse_manifest
    from envhub.envs.sandbox import SANDBOXES, reap
    from envhub.envs.sandbox.kinds import choices
    from envhub.orchestrator.groups import EnvChoice, RunConfig

    assert choices() == [*SANDBOXES, "auto"] and choices(manifest=True)[-1] == "none"
    base = 'name = "x"\nversion = "1.0.0"\nentrypoint = "env:E"\n[sandbox]\n'
    assert parse_manifest(base + f'kind = "{CUSTOM}"').sandbox.kind == CUSTOM
    with pytest.raises(ManifestError, match="field 'sandbox.kind'.*use one of docker, local"):
        parse_manifest(base + 'kind = "vm"')
    with pytest.raises(ManifestError, match="sandbox.supported_kinds"):
        parse_manifest(base + 'supported_kinds = ["docker", "vm"]')
    assert RunConfig(envs=[EnvChoice.parse("arith")], sandbox=CUSTOM).sandbox == CUSTOM
    with pytest.raises(ValueError, match="use one of docker, local, e2b, auto"):
        RunConfig(envs=[EnvChoice.parse("arith")], sandbox="vm")

    async def custom() -> tuple[str, bytes]:
        box = await open_sandbox(CUSTOM, SandboxSpec(), run_id="t-custom-kind",
                                 workdir_files={"a.txt": "1"})
        try:
            return box.kind, await box.read_file("a.txt")  # type: ignore[attr-defined]
        finally:
            await box.close()

    assert run(custom()) == ("folder", b"1")
    assert reap("t-custom-kind", kinds=[CUSTOM]) == []  # closed already: nothing left


def test_auto_follows_docker_reachability() -> None:
    assert best_available() == ("docker" if docker_reachable() else "local")


@pytest.mark.docker
def test_auto_opens_docker_when_reachable() -> None:
    require_docker()
    run_id = f"t-open-{uuid.uuid4().hex[:8]}"

    async def scenario() -> str:
        box = await open_sandbox("auto", SandboxSpec(), run_id=run_id)
        try:
            return box.kind  # type: ignore[attr-defined]
        finally:
            await box.close()

    assert run(scenario()) == "docker"


@pytest.mark.bwrap
def test_failed_seeding_closes_the_sandbox(tmp_path: Path) -> None:
    require_tool("bwrap")
    import tempfile

    before = set(Path(tempfile.gettempdir()).glob("envhub-local-t-seed*"))
    with pytest.raises(SandboxFileError):
        run(open_sandbox("local", SandboxSpec(), run_id="t-seed",
                         workdir_files={"ok.txt": "1", "../escape.txt": "2"}))
    assert set(Path(tempfile.gettempdir()).glob("envhub-local-t-seed*")) == before


def test_cli_bad_input_exits_2() -> None:
    runner = CliRunner()
    r = runner.invoke(cli(), ["sandbox", "reap", "--run", "x", "--all"])
    assert r.exit_code == 2 and "either --run" in r.output
    r = runner.invoke(cli(), ["sandbox", "check", "vm"])
    assert r.exit_code == 2 and "unknown sandbox kind" in r.output
    r = runner.invoke(cli(), ["image", "build"])
    assert r.exit_code == 2 and "exactly one" in r.output


@pytest.mark.bwrap
def test_cli_check_local() -> None:
    require_tool("bwrap")
    r = CliRunner().invoke(cli(), ["sandbox", "check", "local"])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("local: opened in") and "exec exit 0: ok" in r.output


@pytest.mark.docker
def test_cli_reap_list_and_build_base() -> None:
    require_docker()
    run_id = f"t-cli-{uuid.uuid4().hex[:8]}"
    box = run(open_sandbox("docker", SandboxSpec(), run_id=run_id))
    runner = CliRunner()
    listing = runner.invoke(cli(), ["sandbox", "list"])
    assert listing.exit_code == 0 and run_id in listing.output
    stale = runner.invoke(cli(), ["sandbox", "reap"])  # only stale ones: ours is alive
    assert stale.exit_code == 0 and box.id[:12] not in stale.output
    reaped = runner.invoke(cli(), ["sandbox", "reap", "--run", run_id])
    assert reaped.exit_code == 0 and "removed 1 sandbox(es)" in reaped.output
    assert run_id not in runner.invoke(cli(), ["sandbox", "list"]).output
    base = runner.invoke(cli(), ["image", "build-base"])
    assert base.exit_code == 0 and "envhub/base:" in base.output and "cached" in base.output
