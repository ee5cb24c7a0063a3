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
from envhub.gateway.server import run_in_thread
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
    ("nope", "use one of local, openai, scripted, sglang, vllm, zero, or the dotted path"),
    ("no_such_pkg.mod.Backend", "No module named 'no_such_pkg'"),
    ("envhub.gateway.backends.zero.Nope", "has no 'Nope'"),
    ("envhub.gateway.engine.zero.ZeroEngine", "lacks remote, text_only, from_config"),
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


def test_the_scripted_backend_answers_a_script_file_once_each_in_order(tmp_path: Path) -> None:
    # `envhub gateway --backend scripted --script FILE` (and `envhub run --model scripted:FILE`)
    script = tmp_path / "script.json"
    script.write_text('["first answer", "second answer"]')
    config = GatewayConfig(port=0, db=f"sqlite:///{tmp_path}/pool.db", backend="scripted",
                           script=str(script))
    with run_in_thread(config) as gw:
        answers = [httpx.post(gw.url + "/v1/chat/completions", json={
            "model": "default", "messages": [{"role": "user", "content": f"q{i}"}]}, timeout=60)
            for i in range(3)]
    assert [a.json()["choices"][0]["message"]["content"] for a in answers[:2]] == [
        "first answer", "second answer"]
    assert answers[2].status_code == 400, answers[2].text
    assert "exhausted" in answers[2].json()["error"]["message"]


@pytest.mark.parametrize("text,match", [(None, "needs --script FILE"),
                                        ('{"a": 1}', "non-empty JSON list of strings"),
                                        ("[1, 2]", "non-empty JSON list of strings"),
                                        ("not json", "cannot read a JSON list")])
def test_a_bad_script_file_says_what_it_needs(tmp_path: Path, text: str | None,
                                              match: str) -> None:
    script = tmp_path / "script.json"
    if text is not None:
        script.write_text(text)
    config = GatewayConfig(backend="scripted", script=str(script) if text else None)
    with pytest.raises(ValueError, match=match):
        make_backend(config)


def test_a_scripted_text_past_the_budget_is_tokenized_only_as_far_as_the_budget(renderer) -> None:
    """An audit's scripted tool call of 7 MB, answered within a 2,048-token turn: the tokenizer
    reads a prefix (not the 7 MB: ~10 s of it), and the ids answered are the whole text's first
    2,048, cut for length; a text within the budget is answered whole."""
    from envhub.gateway.backends.base import GenerateRequest, SamplingParams
    from envhub.gateway.backends.scripted import ScriptedBackend

    seen: list[int] = []

    def encode(text: str) -> list[int]:
        seen.append(len(text))
        return renderer.encode(text)

    huge = '<tool_call>\n{"name": "bash", "arguments": {"command": "' + "ab 9" * 1_750_000
    backend = ScriptedBackend(encode, [huge, "short answer"], renderer.stop_token_ids[0])

    def answer(max_tokens: int):
        return asyncio.run(backend.generate(GenerateRequest([1], SamplingParams(max_tokens))))

    cut = answer(2048)
    assert cut.finish_reason == "length" and len(cut.completion_ids) == 2048
    assert cut.completion_ids == renderer.encode(huge[:200_000])[:2048]
    assert max(seen) < 200_000, seen
    whole = answer(2048)
    assert whole.finish_reason == "stop"
    assert whole.completion_ids == renderer.encode("short answer") + renderer.stop_token_ids[:1]
