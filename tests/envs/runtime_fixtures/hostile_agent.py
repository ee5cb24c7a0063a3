#!/usr/bin/env python3
"""A command agent that tries every way out it can think of, for containment tests; standard
library only (it runs with whatever python3 the sandbox has). Prints one line
`PROBE <json>`: what it reached.

    hostile_agent.py HOST_PORT HOST_IP MARKER PATH...
HOST_PORT: a TCP server the test runs on the host (0.0.0.0); HOST_IP: the host's address;
MARKER: a word put on a detached `setsid` loop's command line (the test looks for it in `ps`
afterwards) and in the names of files it writes (/etc, /, next to each PATH: the test looks on
the host); PATH...: host files it must not read (another rollout's workdir, task data).
"""

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request


def connect(host, port):
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def unix_connect(path):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(3)
    try:
        s.connect(path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def writable(path):
    """Writes (and keeps) `path`: the test looks on the host for what got through."""
    try:
        with open(path, "w") as f:
            f.write("pwned")
        return True
    except OSError:
        return False


def readable(path):
    try:
        with open(path, "rb") as f:
            f.read(1)
        return True
    except OSError:
        return False


def http(path, data=None, key=None):
    """Status of a request to the gateway through the agent's own base URL."""
    root = os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:1/v1").rsplit("/v1", 1)[0]
    headers = {"content-type": "application/json",
               "authorization": "Bearer " + (key or os.environ.get("OPENAI_API_KEY", ""))}
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(root + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return -1


port, host_ip, marker, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
chat = {"model": os.environ.get("ENVHUB_MODEL", "default"), "max_tokens": 8,
        "messages": [{"role": "user", "content": "hello"}]}
subprocess.Popen(["setsid", "sh", "-c", "while :; do sleep 1; done; : " + marker],
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
report = {
    "gateway_chat": http("/v1/chat/completions", chat),
    "admin_route": http("/sessions"),
    "session_route": http("/s/" + os.environ.get("ENVHUB_SESSION_ID", "x") + "/v1/models"),
    "loopback_server": connect("127.0.0.1", port),
    "host_ip_server": connect(host_ip, port),
    "docker_socket": any(os.path.exists(p) or unix_connect(p)
                         for p in ("/var/run/docker.sock", "/run/docker.sock")),
    "etc_write": writable("/etc/envhub-probe-" + marker),
    "root_write": writable("/envhub-probe-" + marker),
    "workdir_write": writable(os.path.join(os.getcwd(), "probe-" + marker)),
    "host_folders_written": [p for p in paths
                             if writable(os.path.join(os.path.dirname(p), "pwned-" + marker))],
    "host_files_read": [p for p in paths if readable(p)],
    "key_is_placeholder": os.environ.get("OPENAI_API_KEY") == "envhub-sandboxed",
}
print("PROBE " + json.dumps(report), flush=True)
