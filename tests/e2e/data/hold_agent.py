"""A command-line agent for the asynchronous `envhub train` tests (run by the CommandAgent, its
model calls go through its own gateway session like any agent's).

    hold_agent.py TASK_ID HOLD_TASK_ID file PATH       wait for PATH to exist
    hold_agent.py TASK_ID HOLD_TASK_ID version N       wait for the engine's weight version >= N

One model call; then, on the task HOLD_TASK_ID only, the wait; then a second call that extends
the conversation. A wait that does not end in 120 s exits 3 (the test then fails, never hangs).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

from openai import OpenAI

WAIT_S = 120.0


def released(mode: str, arg: str) -> bool:
    if mode == "file":
        return Path(arg).exists()
    root = os.environ["OPENAI_BASE_URL"].removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/health", timeout=10) as r:
        return int(json.load(r)["backend"]["weight_version"]) >= int(arg)


def main() -> int:
    task_id, hold, mode, arg = sys.argv[1:5]
    client = OpenAI(max_retries=0)
    messages = [{"role": "user", "content": Path(os.environ["ENVHUB_TASK_FILE"]).read_text()}]
    reply = client.chat.completions.create(model=os.environ["ENVHUB_MODEL"], messages=messages,
                                           max_tokens=4)
    if task_id == hold:
        deadline = time.monotonic() + WAIT_S
        while not released(mode, arg):
            if time.monotonic() > deadline:
                return 3
            time.sleep(0.05)
    messages += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                 {"role": "user", "content": "Go on."}]
    client.chat.completions.create(model=os.environ["ENVHUB_MODEL"], messages=messages,
                                   max_tokens=4)
    return 0


if __name__ == "__main__":
    sys.exit(main())
