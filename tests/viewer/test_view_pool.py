"""`envhub view` over a pool URL and its bad input: a real gateway records sessions (scripted
completions, real tokenizer, a detected CM action), the viewer serves them on loopback."""

from __future__ import annotations

import html
import re
import sqlite3
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from envhub.cli import app
from envhub.gateway.config import BUNDLED_MODEL, GatewayConfig
from envhub.gateway.server import run_in_thread
from envhub.sdk import Session
from envhub.sdk.serve import serve_in_thread
from envhub.viewer.app import create_app
from envhub.viewer.sources import open_source
from envhub.viewer.tokens import TokenDecoder
from tests.gateway.conftest import CALC_TOOL
from tests.support import scripted_backend, tool_call

MARKUP = "<script>document.title='x'</script>"


def record_pool(db: str) -> tuple[str, int]:
    """A pool at `db` with two runs: run-a's session made 3 calls and then truncated its
    history (a detected CM action) and was rewarded; run-b's ended as env_failure. Returns
    run-a's session id and its number of sampled tokens."""
    gw = run_in_thread(GatewayConfig(port=0, db=db), backend=scripted_backend(
        [tool_call("calc", {"expr": "6*7"}), "The answer is 42, 因为六乘以七"]))
    try:
        s = Session.open(gw.url, group_id="run-a:arith:t1", task_id=f"t1{MARKUP}", env="arith")
        client = s.openai(max_retries=0)
        msgs: list[dict] = [{"role": "system", "content": "sys"},
                            {"role": "user", "content": "what is 6*7?"}]
        for k in range(3):
            m = client.chat.completions.create(model="default", messages=msgs,
                                               tools=[CALC_TOOL]).choices[0].message
            msgs.append(m.model_dump(exclude_none=True))
            msgs += ([{"role": "tool", "tool_call_id": c.id, "content": "42"}
                      for c in m.tool_calls] if m.tool_calls
                     else [{"role": "user", "content": f"more {k}"}])
        client.chat.completions.create(model="default", messages=msgs[:2] + msgs[4:],
                                       tools=[CALC_TOOL])  # drops the first exchange
        s.reward("outcome", 1.0, name="verifier", weight=1.0,
                 info={"test_log": f"collected 3 items\n3 passed {MARKUP}", "tests": 3})
        s.reward("process", -0.5, name="tool_error", weight=0.1)
        sampled = sum(len(t.completion_ids) for t in s.trajectory().turns)
        s.close("done")
        Session.open(gw.url, group_id="run-b:arith:t2", task_id="t2",
                     env="arith").close("env_failure", reason=f"sandbox died {MARKUP}")
    finally:
        gw.close()
    return s.id, sampled


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def pool_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/pool.db"
    return str(request.getfixturevalue("postgres_server").create_database())


def test_a_pool_url_shows_runs_sessions_and_tokens(pool_url: str) -> None:
    sid, sampled = record_pool(pool_url)
    source = open_source(pool_url)
    try:
        with serve_in_thread(create_app(source)) as server:
            runs = httpx.get(server.url + "/").text
            assert "run-a" in runs and "run-b" in runs

            failed = httpx.get(server.url + "/sessions", params={"status": "env_failure"}).text
            assert failed.count('<tr class="status-') == 1
            assert "sandbox died &lt;script&gt;" in failed and MARKUP not in failed
            rewarded = httpx.get(server.url + "/sessions", params={"min_reward": "0.9"}).text
            assert re.findall(r'class="session"[^>]*>([0-9a-f]+)<', rewarded) == [sid]

            r = httpx.get(f"{server.url}/runs/run-a/sessions/{sid}")
            assert r.status_code == 200
            page = r.text
            assert MARKUP not in page and "t1&lt;script&gt;" in page
            assert len(re.findall(r'<span class="s(?: sp)?" title="sampled', page)) == sampled
            assert "context management: truncate</b> (detected)" in page
            shown = html.unescape("".join(re.findall(
                r'title="sampled[^"]*"[^>]*>(.*?)</span>', page, re.S)))
            assert "The answer is 42, 因为六乘以七" in shown  # split characters decode whole
            assert re.search(r"<th>total</th>.*?0\.950", page, re.S)  # 1.0*1 + (-0.5)*0.1

            # the reward's info as text a person reads: the log's own line breaks, escaped
            [info] = re.findall(r'<pre class="info">(.*?)</pre>', page, re.S)[:1]
            assert info.startswith("test_log:\ncollected 3 items\n3 passed &lt;script&gt;")
            assert info.endswith("tests: 3")
            # every page forbids script of any kind and is answered to HEAD as to GET
            for path in ("/", "/sessions", f"/runs/run-a/sessions/{sid}", "/static/view.css"):
                got, head = httpx.get(server.url + path), httpx.head(server.url + path)
                assert (got.status_code, head.status_code) == (200, 200), path
                assert head.content == b"" and head.headers["content-type"] == \
                    got.headers["content-type"]
                policy = got.headers["content-security-policy"]
                assert "script-src 'none'" in policy and "default-src 'none'" in policy
                assert head.headers["content-security-policy"] == policy

            bad = httpx.get(server.url + "/sessions", params={"max_reward": "abc"})
            assert bad.status_code == 400 and "is not a number" in bad.text
            assert httpx.get(f"{server.url}/runs/run-a/sessions/nope").status_code == 404
    finally:
        source.close()


def test_token_pieces_join_to_the_decoded_text() -> None:
    decoder = TokenDecoder(BUNDLED_MODEL)
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(BUNDLED_MODEL / "tokenizer.json"))
    text = "<|im_start|>user\nhé 因为六 🙂 x=1<|im_end|>"
    ids = tok.encode(text).ids
    pieces = decoder.pieces(ids)
    assert [p.id for p in pieces] == ids
    assert "".join(p.text for p in pieces) == tok.decode(ids, skip_special_tokens=False)
    assert "\ufffd" not in "".join(p.text for p in pieces)
    assert pieces[0].special and not pieces[1].special
    assert decoder.pieces([10**9])[0].text == f"⟨{10**9}?⟩"  # another tokenizer's id


@pytest.mark.parametrize(("args", "message"), [
    (["{tmp}/missing"], "no such folder"),
    (["{tmp}/file.txt"], "not a folder"),
    (["{tmp}"], "no run here"),
    (["sqlite:///{tmp}/missing.db"], "no such pool file"),
    (["sqlite:///{tmp}/file.txt"], "cannot read the pool"),
    (["sqlite:///{tmp}/other.db"], "not an envhub pool"),
    (["ftp://example.org/pool"], "not a pool URL"),
    (["{tmp}", "--host", "0.0.0.0"], "no authentication"),
    (["{tmp}", "--port", "70000"], "--port: Input should be less than or equal to 65535"),
    (["{tmp}", "--tokenizer", "{tmp}/no-model"], "no tokenizer.json"),
])
def test_bad_input_exits_2_with_the_fix(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "file.txt").write_text("not a database\n")
    with sqlite3.connect(tmp_path / "other.db") as db:  # someone else's database
        db.execute("CREATE TABLE notes (body TEXT)")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    result = CliRunner().invoke(app, ["view", *[a.replace("{tmp}", str(tmp_path))
                                                for a in args]])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing written


def test_a_session_page_shows_its_chains_as_a_tree(tmp_path: Path) -> None:
    """A helper call copying the main history under its own system prompt and tools is shown as
    a side chain under the main chain; each turn names its chain, a CM action the messages it
    moved and the turn it continues from."""
    db = f"sqlite:///{tmp_path}/pool.db"
    gw = run_in_thread(GatewayConfig(port=0, db=db), backend=scripted_backend(
        ["I will add it.", "Noted.", "Done."]))
    try:
        s = Session.open(gw.url, group_id="run-c:x:t", task_id="t", env="x")
        client = s.openai(max_retries=0)
        msgs: list[dict] = [{"role": "system", "content": "sys"},
                            {"role": "user", "content": "add a greeting"}]
        m = client.chat.completions.create(model="default", messages=msgs, tools=[CALC_TOOL])
        msgs += [m.choices[0].message.model_dump(exclude_none=True),
                 {"role": "user", "content": "and a farewell"}]
        client.chat.completions.create(model="default", messages=[
            {"role": "system", "content": "You extract memories."}, *msgs[1:]])
        client.chat.completions.create(model="default", messages=msgs, tools=[CALC_TOOL])
        s.close("done")
    finally:
        gw.close()
    source = open_source(db)
    try:
        with serve_in_thread(create_app(source)) as server:
            page = httpx.get(f"{server.url}/runs/run-c/sessions/{s.id}").text
    finally:
        source.close()
    tree = re.search(r'<ul class="chains">(.*)</ul>', page, re.S)
    assert tree is not None, page
    # chain 0 (main), and chain 1 nested under it as its side chain
    assert re.search(r'id="chain-0"><b>chain 0</b> \(main\).*?<ul>\s*<li class="chain" '
                     r'id="chain-1"><b>chain 1</b> · side chain of <a href="#chain-0">',
                     tree.group(1), re.S), tree.group(1)
    assert '<a href="#chain-1">chain 1</a> · segment' in page  # the side call's turn
