"""Closed sets of values in `envhub.toml` are checked at load: tool names, sandbox kinds,
reward keys, booleans and numbers given as strings. The message names the field, the bad value
and what to write instead; `envhub info` and `envhub run` exit 2 and create nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from envhub.envs.loader import check_tools, load_env
from envhub.envs.manifest import ManifestError, parse_manifest
from envhub.envs.sandbox.kinds import choices
from envhub.envs.tools import TOOL_NAMES
from tests.envs.conftest import MANIFEST, make_pkg
from tests.support import envhub

SHARED = ", ".join(TOOL_NAMES)


@pytest.mark.parametrize("extra,message", [
    ('\n[sandbox]\nnetwork = "no"\n',
     "field 'sandbox.network': 'no' is a string, not a boolean; write network = false"),
    ('\n[sandbox]\nnetwork = "yes"\n', "write network = true"),
    ('\n[sandbox]\ncpus = "2"\n', "field 'sandbox.cpus': '2' is not a number"),
    ("\n[agent]\nmax_turns = 2.5\n", "field 'agent.max_turns': 2.5 is not a whole number"),
    ('\n[sandbox]\nkind = "vm"\n',
     f"field 'sandbox.kind': unknown sandbox kind 'vm'; use one of {', '.join(choices(True))}"),
    ('\n[sandbox]\nsupported_kinds = ["docker", "vm"]\n', "field 'sandbox.supported_kinds'"),
    ('\n[rewards]\nspeed = 1.0\n', "field 'rewards': unknown reward weight 'speed'; use"),
    ('\n[rewards]\noutcome = "1"\n', "field 'rewards.outcome"),
])
def test_bad_values_name_field_value_and_fix(extra: str, message: str) -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifest(MANIFEST + extra)
    assert message in str(info.value)
    assert "Value error," not in str(info.value) and "Input should" not in str(info.value)


@pytest.mark.parametrize("tools,message", [
    ('["bash", "bash"]', "tool 'bash' is listed twice"),
    ('["bash", "rm -rf"]', "tool name 'rm -rf' is not valid"),
    ('"bash"', "field 'tools': 'bash' is not a list"),
])
def test_malformed_tool_lists(tools: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        parse_manifest(f"tools = {tools}\n" + MANIFEST)


def test_unknown_tool_is_refused_at_load_with_the_table(tmp_path: Path) -> None:
    pkg = make_pkg(tmp_path / "pkg", manifest='tools = ["bash", "shell"]\n' + MANIFEST)
    with pytest.raises(ManifestError) as info:
        load_env(str(pkg))
    assert (f"envhub.toml: field 'tools': unknown tool 'shell'; use one of {SHARED}"
            in str(info.value))


def test_an_environments_own_tools_are_allowed_and_checked(tmp_path: Path) -> None:
    loaded = load_env("arith")  # a ToolProvider: calculator is its own
    tasks = loaded.env.load_tasks()
    check_tools(loaded, tasks)
    loaded.manifest.tools.append("abacus")
    with pytest.raises(ManifestError, match=r"unknown tool 'abacus'; use one of .*calculator"):
        check_tools(loaded, tasks)


@pytest.mark.parametrize("command", ["info", "run"])
def test_cli_exits_2_with_the_message_and_creates_nothing(tmp_path: Path, command: str) -> None:
    pkg = make_pkg(tmp_path / "pkg", manifest='tools = ["bash", "shell"]\n' + MANIFEST
                   + '\n[sandbox]\nkind = "none"\n')
    work = tmp_path / "cwd"
    work.mkdir()
    args = [command, str(pkg)] + (["--agent", "oracle"] if command == "run" else [])
    before = sorted(os.listdir(pkg))
    result = envhub(*args, cwd=work)
    assert result.returncode == 2, result.stderr
    assert "field 'tools': unknown tool 'shell'; use one of" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(work.iterdir()) == [] and sorted(os.listdir(pkg)) == before

    (pkg / "envhub.toml").write_text(MANIFEST + '\n[sandbox]\nnetwork = "no"\n')
    result = envhub(*args, cwd=work)
    assert result.returncode == 2 and "write network = false" in result.stderr
    assert list(work.iterdir()) == []
