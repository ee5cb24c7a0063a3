"""Record a real client's requests to the gateway as a trace for the corpus (test_traces.py).

    python -m tests.gateway.traces.record --script FILE --client "aider 0.86.2" OUT.json \
        -- CMD ARGS...

starts a gateway on loopback with a scripted model (the completions in FILE, separated by
lines holding only `=====`), and in front of it a recording proxy; CMD runs with
OPENAI_API_BASE / OPENAI_BASE_URL / ANTHROPIC_BASE_URL pointing at the proxy and
ENVHUB_TRACE_URL set to it. Every model request the client sends (path, body) is saved in
order with the script, so the corpus test replays the same requests against a gateway that
samples the same completions. Fill the trace's `expect` (chains, CM actions) by hand, from
what the client really did, never from what the gateway recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from fastapi import FastAPI, Request, Response

from envhub.sdk.serve import serve_in_thread
from tests.support import gateway_in_thread, scripted_backend

KEY = "trace"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--script", type=Path, required=True)
    ap.add_argument("--client", required=True, help="the client and its version")
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    script = [c.strip("\n") for c in args.script.read_text().split("\n=====\n")]
    requests: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        gw = gateway_in_thread(Path(tmp), scripted_backend(script))
        app = FastAPI()
        client = httpx.AsyncClient(base_url=gw.url, timeout=120)

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def forward(path: str, request: Request) -> Response:
            body = await request.body()
            if request.method == "POST" and body:
                requests.append({"path": "/" + path, "body": json.loads(body)})
            r = await client.request(request.method, "/" + path, content=body,
                                     headers={"authorization": f"Bearer {KEY}",
                                              "content-type": "application/json"})
            return Response(r.content, r.status_code,
                            media_type=r.headers.get("content-type"))

        with serve_in_thread(app) as proxy:
            base = proxy.url
            env = {**os.environ, "OPENAI_API_BASE": f"{base}/v1",
                   "OPENAI_BASE_URL": f"{base}/v1", "ANTHROPIC_BASE_URL": base,
                   "ENVHUB_TRACE_URL": base, "OPENAI_API_KEY": KEY, "ANTHROPIC_API_KEY": KEY}
            cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
            ran = subprocess.run(cmd, env=env, check=False)
        traj = httpx.get(f"{gw.url}/sessions/{KEY}/trajectory").json()
        gw.close()
    args.out.write_text(json.dumps({
        "client": args.client, "command": cmd, "exit": ran.returncode, "script": script,
        "requests": requests,
        "recorded": {"turns": [[t["seq"], t["segment"], t["chain"]] for t in traj["turns"]],
                     "cm_actions": [a["kind"] for a in traj["cm_actions"]]},
        "expect": {},
    }, indent=1) + "\n")
    print(f"{len(requests)} requests, client exit {ran.returncode}; recorded "
          f"{[[t['seq'], t['segment'], t['chain']] for t in traj['turns']]} "
          f"{[a['kind'] for a in traj['cm_actions']]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
