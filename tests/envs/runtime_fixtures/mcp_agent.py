#!/usr/bin/env python3
"""A command agent that uses its environment's tools over MCP, standard library only (it runs
with the sandbox's python3): JSON-RPC over HTTP to $ENVHUB_MCP_URL (initialize, tools/list,
tools/call) and the model through $OPENAI_BASE_URL, offering it the listed tools; each tool
call the model makes is run over MCP and its result sent back in the next model call, until
the model calls submit, stops calling tools, or MAX_TURNS. Prints one JSON line per step.

With --probe it first sends requests the channel must refuse or answer itself."""

import json
import os
import socket
import sys
import urllib.error
import urllib.request

MCP = os.environ["ENVHUB_MCP_URL"]
MODEL = os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions"
KEY = os.environ["OPENAI_API_KEY"]
MAX_TURNS = 6


def post(url, body, headers=None):
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers=dict(
        {"content-type": "application/json"}, **(headers or {})))
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text.strip() else None
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def rpc(method, params=None, ident=1):
    headers = {"accept": "application/json, text/event-stream",
               "mcp-protocol-version": "2025-06-18"}
    message = {"jsonrpc": "2.0", "method": method, "params": params or {}}
    if ident is not None:
        message["id"] = ident
    status, answer = post(MCP, message, headers)
    if ident is None:
        return status
    assert status == 200, (method, status, answer)
    assert "result" in answer, answer
    return answer["result"]


def probe(method, url, body=None):
    request = urllib.request.Request(url, method=method, data=body,
                                     headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code


def announce_big_body(url):
    """The status a request announcing a 2 MiB body gets before sending any of it."""
    host, port = url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                  b"content-length: %d\r\n\r\n" % (2 << 20))
        return int(s.recv(100).split(b" ")[1])


def main():
    init = rpc("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "mcp-agent", "version": "1"}})
    print(json.dumps({"server": init["serverInfo"]["name"]}))
    print(json.dumps({"initialized": rpc("notifications/initialized", ident=None)}))
    listed = rpc("tools/list", ident=2)["tools"]
    print(json.dumps({"tools": [t["name"] for t in listed]}))
    if "--probe" in sys.argv:
        root = MCP.rsplit("/", 1)[0]
        print(json.dumps({"probes": {
            "get": probe("GET", MCP),
            "sub": probe("POST", root + "/mcp/x", b"{}"),
            "dots": probe("POST", root + "/mcp/../sessions", b"{}"),
            "admin": probe("GET", root + "/sessions"),
            "other": probe("POST", root + "/s/other-session/mcp", b"{}"),
            "big": announce_big_body(MCP),
        }}))
    tools = [{"type": "function", "function": {
        "name": t["name"], "description": t.get("description") or "",
        "parameters": t["inputSchema"]}} for t in listed]
    messages = [{"role": "user", "content": open(os.environ["ENVHUB_TASK_FILE"]).read()}]
    for turn in range(MAX_TURNS):
        status, reply = post(MODEL, {"model": os.environ["ENVHUB_MODEL"], "messages": messages,
                                     "tools": tools, "max_tokens": 128},
                             {"authorization": "Bearer " + KEY})
        assert status == 200, (status, reply)
        message = reply["choices"][0]["message"]
        messages.append({k: v for k, v in message.items() if v is not None})
        calls = message.get("tool_calls") or []
        if not calls:
            print(json.dumps({"turn": turn, "said": message.get("content")}))
            return
        for call in calls:
            name = call["function"]["name"]
            args = json.loads(call["function"]["arguments"] or "{}")
            result = rpc("tools/call", {"name": name, "arguments": args}, ident=10 + turn)
            text = "".join(c.get("text", "") for c in result["content"])
            print(json.dumps({"turn": turn, "call": name, "result": text,
                              "is_error": result.get("isError", False)}))
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
            if name == "submit":
                return


if __name__ == "__main__":
    main()
