"""Which engines a gateway's fleet has: --upstream flags, TOML/YAML fleet files, bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from envhub.gateway.backends.sglang import SGLangBackend
from envhub.gateway.backends.vllm import VLLMBackend
from envhub.gateway.config import GatewayConfig
from envhub.gateway.errors import BadRequest
from envhub.gateway.router import Fleet, fleet_specs, make_fleet


def config(**kw) -> GatewayConfig:
    return GatewayConfig(backend=kw.pop("backend", "vllm"), **kw)


def test_flags_kinds_and_defaults() -> None:
    specs = fleet_specs(config(backend="sglang", upstreams=[
        "http://h1:30000", "vllm=http://h2:8000/", "sglang=https://h3"]))
    assert [(s.kind, s.url) for s in specs] == [
        ("sglang", "http://h1:30000"), ("vllm", "http://h2:8000"), ("sglang", "https://h3")]


def test_toml_and_yaml_files(tmp_path: Path) -> None:
    toml = tmp_path / "fleet.toml"
    toml.write_text('[[upstream]]\nkind = "sglang"\nurl = "http://a:1"\nname = "a"\n\n'
                    '[[upstream]]\nurl = "http://b:2"\n')
    yaml = tmp_path / "fleet.yaml"
    yaml.write_text("upstream:\n  - {kind: vllm, url: 'http://c:3', model: m}\n")
    fleet = make_fleet(config(fleet_config=str(toml), upstreams=["http://z:9"]))
    assert isinstance(fleet, Fleet)
    members = {n: i.member for n, i in fleet.instances.items()}
    assert isinstance(members["a"], SGLangBackend)
    assert isinstance(members["http://b:2"], VLLMBackend)
    assert list(members) == ["http://z:9", "a", "http://b:2"]
    specs = fleet_specs(config(fleet_config=str(yaml)))
    assert specs[0].model == "m"


@pytest.mark.parametrize("content,match", [
    ("", "lists no upstreams"),
    ('[[upstream]]\nurl = "nope"\n', "field 'url'"),
    ('[[upstream]]\nurl = "http://a"\ncolour = "red"\n', "colour"),
    ("[[upstream]\n", "cannot parse"),
])
def test_bad_fleet_files_name_the_problem(tmp_path: Path, content: str, match: str) -> None:
    f = tmp_path / "fleet.toml"
    f.write_text(content)
    with pytest.raises(BadRequest, match=match):
        fleet_specs(config(fleet_config=str(f)))


def test_missing_file_duplicates_and_no_upstreams(tmp_path: Path) -> None:
    with pytest.raises(BadRequest, match="does not exist"):
        fleet_specs(config(fleet_config=str(tmp_path / "none.toml")))
    with pytest.raises(BadRequest, match="listed twice"):
        fleet_specs(config(upstreams=["http://a:1", "vllm=http://a:1"]))
    with pytest.raises(BadRequest, match="--upstream URL"):
        fleet_specs(config())


def test_cli_rejects_a_bad_fleet_with_exit_code_2(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "envhub", "gateway", "--backend", "sglang",
                        "--upstream", "ftp://x", "--db", f"sqlite:///{tmp_path}/p.db"],
                       check=False, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "http(s) URL" in r.stderr
