"""Model names: any requested name maps to a served model through the alias table, and the
requested name is recorded on the turn (official clients, real gateway)."""

from __future__ import annotations

import sqlite3

import anthropic
import openai
import pytest
from pydantic import ValidationError

from envhub.gateway.config import GatewayConfig
from tests.gateway.conftest import client as anthropic_client
from tests.gateway.conftest import scripted, start
from tests.support import envhub
from tests.support import trajectory_json as trajectory

HI = [{"role": "user", "content": "hi"}]


def openai_client(gw, key):
    return openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)


def test_any_name_is_served_by_default_and_recorded(tmp_path, renderer):
    gw = start(tmp_path, scripted(renderer, ["Fine."]))
    try:
        msg = anthropic_client(gw, "claude-code").messages.create(
            model="claude-sonnet-4-5", max_tokens=16, messages=HI)
        assert msg.model == "claude-sonnet-4-5" and msg.content[0].text == "Fine."
        chat = openai_client(gw, "codex").chat.completions.create(model="gpt-5", messages=HI)
        assert chat.model == "gpt-5" and chat.choices[0].message.content == "Fine."
        done = openai_client(gw, "codex").completions.create(model="gpt-5-mini", prompt="x",
                                                            max_tokens=2)
        assert done.model == "gpt-5-mini"
        [turn] = trajectory(gw, "claude-code")["turns"]
        assert turn["requested_model"] == "claude-sonnet-4-5"
        assert [t["requested_model"] for t in trajectory(gw, "codex")["turns"]] == [
            "gpt-5", "gpt-5-mini"]
    finally:
        gw.close()


def test_an_alias_table_serves_matches_and_refuses_the_rest(tmp_path, renderer):
    gw = start(tmp_path, scripted(renderer, ["Fine."]),
               model_aliases=["claude-*-4-5=default", "claude-*=tiny", "gpt-5*=default"])
    try:
        served = [anthropic_client(gw, "a").messages.create(
            model=name, max_tokens=8, messages=HI).model
            for name in ("claude-haiku-4-5", "claude-3-opus", "tiny", "default")]
        assert served == ["claude-haiku-4-5", "claude-3-opus", "tiny", "default"]
        assert openai_client(gw, "o").chat.completions.create(
            model="gpt-5-codex", messages=HI).model == "gpt-5-codex"
        with pytest.raises(openai.NotFoundError) as err:
            openai_client(gw, "o").chat.completions.create(model="gpt-4o", messages=HI)
        assert err.value.code == "model_not_found" and err.value.body["param"] == "model"
        assert "aliases: claude-*-4-5=default" in err.value.body["message"]
        with pytest.raises(anthropic.NotFoundError) as aerr:
            anthropic_client(gw, "a").messages.create(model="o3", max_tokens=8, messages=HI)
        assert aerr.value.body["error"]["type"] == "not_found_error"
        assert "--model-alias" in aerr.value.body["error"]["message"]
        assert [t["requested_model"] for t in trajectory(gw, "a")["turns"]] == served
    finally:
        gw.close()


@pytest.mark.parametrize("aliases,words", [
    (["claude-*"], "must be PATTERN=MODEL"),
    (["=default"], "must be PATTERN=MODEL"),
    (["claude-*=opus"], "'opus' is not served here; served: tiny, default"),
])
def test_bad_alias_tables_are_refused_at_start(aliases, words):
    with pytest.raises(ValidationError, match=words):
        GatewayConfig(model_aliases=aliases)


def test_cli_takes_repeated_model_alias_flags(tmp_path):
    r = envhub("gateway", "--model-alias", "claude-*=default", "--model-alias", "gpt-*",
               "--db", f"sqlite:///{tmp_path}/pool.db", timeout=120)
    assert r.returncode == 2 and "'gpt-*' must be PATTERN=MODEL" in r.stderr, r.stderr


def test_a_pool_from_before_requested_models_opens_and_keeps_its_turns(tmp_path, renderer):
    """The name is kept in its own table (create_all adds tables, never columns): a pool
    without that table opens, its old turns read back with requested_model None."""
    gw = start(tmp_path, scripted(renderer, ["Fine."]))
    openai_client(gw, "old").chat.completions.create(model="gpt-5", messages=HI)
    gw.close()
    with sqlite3.connect(tmp_path / "pool.db") as db:  # as an older gateway left it
        db.execute("DROP TABLE turn_info")
    gw = start(tmp_path, scripted(renderer, ["Fine."]))
    try:
        openai_client(gw, "old").chat.completions.create(
            model="gpt-5.1", messages=[*HI, {"role": "assistant", "content": "Fine."}, *HI])
        turns = trajectory(gw, "old")["turns"]
        assert [t["requested_model"] for t in turns] == [None, "gpt-5.1"]
        assert turns[1]["prompt_ids"][:len(turns[0]["prompt_ids"])] == turns[0]["prompt_ids"]
    finally:
        gw.close()
