"""Why the gateway never re-tokenizes: decoded-and-re-encoded history is not what was sampled.

Two realistic cases with the real BPE tokenizer: a model that samples a word in pieces (BPE is
not a bijection: decode→encode merges them), and a model whose tool-call JSON is spaced
differently from how the chat template re-renders it.
"""

from __future__ import annotations

import httpx
import openai

from tests.gateway.conftest import CALC_TOOL, scripted, start


def test_bpe_is_not_a_bijection(renderer):
    sampled = renderer.encode(" wor") + renderer.encode("ld")  # a valid, non-canonical split
    text = renderer.decode(sampled)
    assert text == " world"
    assert renderer.encode(text) != sampled


def test_record_keeps_sampled_ids_where_rerendering_differs(tmp_path, renderer):
    pieces = renderer.encode("Let me comp") + renderer.encode("ute.")  # sampled in pieces
    compact = '<tool_call>\n{"name":"calc","arguments":{"expr":"6*7"}}\n</tool_call>'
    backend = scripted(renderer, [compact, "done"])
    backend._encode = lambda text, enc=renderer.encode: (
        pieces + enc("\n" + text) if text == compact else enc(text))
    gw = start(tmp_path, backend)
    try:
        c = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="why", max_retries=0)
        msgs = [{"role": "user", "content": "6*7?"}]
        m = c.chat.completions.create(model="default", messages=msgs,
                                      tools=[CALC_TOOL]).choices[0].message
        msgs += [m.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": m.tool_calls[0].id, "content": "42"}]
        c.chat.completions.create(model="default", messages=msgs, tools=[CALC_TOOL])
        turns = httpx.get(f"{gw.url}/sessions/why/trajectory").json()["turns"]
    finally:
        gw.close()
    sampled = turns[0]["completion_ids"]
    # the gateway's record: the second prompt contains the first completion verbatim
    start_at = len(turns[0]["prompt_ids"])
    assert turns[1]["prompt_ids"][start_at:start_at + len(sampled)] == sampled
    # re-rendering the same messages with the template and re-tokenizing does not
    rerendered = renderer.render_prompt(msgs, [CALC_TOOL]).ids
    assert rerendered != turns[1]["prompt_ids"]
    assert rerendered[:start_at] == turns[1]["prompt_ids"][:start_at]  # differs after the prompt
