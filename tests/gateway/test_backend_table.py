"""Choosing a backend: the BACKENDS table, dotted paths, upstream kinds, missing capabilities."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from envhub.gateway.backends import BACKENDS, backend_class, make_backend
from envhub.gateway.backends.base import Backend, WeightsNotLoadable
from envhub.gateway.backends.zero import ZeroBackend
from envhub.gateway.config import GatewayConfig
from envhub.gateway.errors import BadRequest
from envhub.gateway.router import Fleet, make_fleet
from tests.gateway.conftest import scripted, start


def test_every_table_entry_is_a_backend_class() -> None:
    for name in BACKENDS:
        cls = backend_class(name)
        assert isinstance(cls.remote, bool) and isinstance(cls.text_only, bool), name
    assert backend_class("openai").text_only and not backend_class("vllm").text_only


def test_a_dotted_path_works_like_a_name() -> None:
    backend = make_backend(GatewayConfig(backend="envhub.gateway.backends.zero.ZeroBackend"))
    assert isinstance(backend, ZeroBackend) and isinstance(backend, Backend)


@pytest.mark.parametrize("name,match", [
    ("nope", "use one of local, openai, sglang, vllm, zero, or the dotted path"),
    ("no_such_pkg.mod.Backend", "No module named 'no_such_pkg'"),
    ("envhub.gateway.backends.zero.Nope", "has no 'Nope'"),
    ("envhub.gateway.backends.scripted.ScriptedBackend", "lacks remote, text_only, from_config"),
])
def test_unknown_backends_list_the_choices(name: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        backend_class(name)


def test_upstream_kinds_come_from_the_table_and_dotted_paths() -> None:
    fleet = make_fleet(GatewayConfig(backend="sglang", upstreams=[
        "http://a:1", "envhub.gateway.backends.vllm.VLLMBackend=http://b:2"]))
    assert isinstance(fleet, Fleet)
    assert [i.member.name for i in fleet.instances.values()] == ["sglang", "vllm"]
    with pytest.raises(BadRequest, match="takes no URL"):
        make_fleet(GatewayConfig(backend="vllm", upstreams=["zero=http://c:3"]))


def test_in_process_members_refuse_out_of_band_versions() -> None:
    fleet = Fleet([ZeroBackend(instance="z0")])
    with pytest.raises(WeightsNotLoadable, match="runs in the gateway's process"):
        asyncio.run(fleet.update_weights(None, 3))


def test_admin_weights_on_a_backend_without_weights_is_a_400(tmp_path: Path, renderer) -> None:
    with start(tmp_path, scripted(renderer, ["hi"]), admin_key="adm") as gw:
        r = httpx.post(gw.url + "/admin/weights", json={"path": str(tmp_path)},
                       headers={"authorization": "Bearer adm"})
    assert r.status_code == 400 and "no weights to load" in r.json()["error"]["message"]
