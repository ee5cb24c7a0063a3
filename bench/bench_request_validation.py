"""What validating a request body costs per call, next to parsing its JSON (which every route
pays anyway), for agent-shaped bodies of growing history: the chat route's `ChatRequest`, the
Anthropic route's `MessagesRequest` (gateway/models/). In-process, best of 7 repeats, so a busy
machine shifts both columns alike.

    python bench/bench_request_validation.py [--number 2000]
"""

from __future__ import annotations

import argparse
import timeit
from typing import Any

import orjson

from envhub.gateway.models.anthropic import MessagesRequest
from envhub.gateway.models.base import parse
from envhub.gateway.models.openai import ChatRequest

SCHEMA = {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}


def chat_body(turns: int) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for i in range(turns):
        msgs += [{"role": "user", "content": f"question {i}"},
                 {"role": "assistant", "content": "", "tool_calls": [{
                     "id": f"call_{i}", "type": "function",
                     "function": {"name": "calc", "arguments": '{"expr": "1+1"}'}}]},
                 {"role": "tool", "tool_call_id": f"call_{i}", "content": "2"}]
    tools = [{"type": "function", "function": {"name": f"t{j}", "parameters": SCHEMA}}
             for j in range(3)]
    return {"model": "default", "messages": msgs, "tools": tools, "tool_choice": "auto",
            "temperature": 0.7, "max_tokens": 64, "stream": False, "logprobs": True}


def messages_body(turns: int) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        msgs += [{"role": "user", "content": [{"type": "text", "text": f"question {i}"}]},
                 {"role": "assistant", "content": [{"type": "tool_use", "id": f"toolu_{i}",
                                                    "name": "calc", "input": {"expr": "1"}}]}]
    msgs.append({"role": "user", "content": "go on"})
    tools = [{"name": f"t{j}", "input_schema": SCHEMA} for j in range(3)]
    return {"model": "default", "system": "You are helpful.", "messages": msgs, "tools": tools,
            "max_tokens": 64, "temperature": 0.7, "metadata": {"user_id": "u"}}


def best_us(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--number", type=int, default=2000, help="calls per timing")
    args = ap.parse_args()
    print(f"{'body':<22}{'json parse us':>15}{'validate us':>13}{'ratio':>8}")
    for name, make, model in (("chat", chat_body, ChatRequest),
                              ("messages", messages_body, MessagesRequest)):
        for turns in (1, 10, 100):
            raw = orjson.dumps(make(turns))
            body = orjson.loads(raw)
            parse_us = best_us(lambda raw=raw: orjson.loads(raw), args.number)
            check_us = best_us(lambda body=body, model=model: parse(model, body).ignored(),
                               args.number)
            print(f"{f'{name}, {turns} turns':<22}{parse_us:>15.1f}{check_us:>13.1f}"
                  f"{check_us / parse_us:>8.2f}")


if __name__ == "__main__":
    main()
