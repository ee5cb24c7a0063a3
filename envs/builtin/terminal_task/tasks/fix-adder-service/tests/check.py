import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
# The agent's code runs as nobody: as root it could rewrite /logs/verifier/reward.txt after
# this check wrote it (a daemon forked by server.py).
server = subprocess.Popen([sys.executable, "/app/server.py", str(port)], user=65534, group=65534,
                          extra_groups=[])


def call(path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


try:
    for _ in range(100):
        try:
            call("/health")
            break
        except OSError:
            time.sleep(0.1)
    checks = [
        (call("/health"), (200, {"status": "ok"})),
        (call("/add?a=2&b=3"), (200, {"sum": 5})),
        (call("/add?a=1.5&b=2.25"), (200, {"sum": 3.75})),
        (call("/sum", {"values": [1, 2, 3]}), (200, {"sum": 6})),
    ]
    for got, want in checks:
        if got != want:
            sys.exit(f"got {got}, want {want}")
    for bad in ("/add?a=x&b=1", "/add?a=1"):
        code, body = call(bad)
        if code != 400 or not isinstance(body, dict) or "error" not in body:
            sys.exit(f"{bad}: got {code} {body}, want 400 with an error field")
    if call("/health") != (200, {"status": "ok"}):
        sys.exit("the service died after bad requests")
finally:
    server.kill()
