"""A command-line agent for tests: uses only the official `openai` client and the environment
variables envhub sets (OPENAI_BASE_URL, OPENAI_API_KEY), like any third-party agent would.

Makes TURNS chat calls (default 2) about the task in ENVHUB_TASK_FILE, then prints the last
reply. Optional behaviours for leak tests: SPAWN_CHILD=1 starts a long `sleep` in the
background and records its pid in CHILD_PID_FILE; INFO_FILE receives {"cwd", "session_id"}
as JSON once the chat calls are done; SLEEP=N sleeps N seconds before exiting; EXIT=N exits
with code N.
"""

import json
import os
import subprocess
import sys
import time

if os.environ.get("SPAWN_CHILD"):  # before importing openai: a loaded machine's time limit
    child = subprocess.Popen(["sleep", "1000"])  # must not come first
    with open(os.environ["CHILD_PID_FILE"] + ".tmp", "w") as f:
        f.write(str(child.pid))
    os.replace(os.environ["CHILD_PID_FILE"] + ".tmp", os.environ["CHILD_PID_FILE"])

import openai  # noqa: E402

with open(os.environ["ENVHUB_TASK_FILE"], encoding="utf-8") as f:
    task = f.read()
client = openai.OpenAI(max_retries=0)  # base URL and key come from the environment
messages = [{"role": "user", "content": task}]
for _ in range(int(os.environ.get("TURNS", "2"))):
    reply = client.chat.completions.create(model=os.environ.get("ENVHUB_MODEL", "default"),
                                           messages=messages, max_tokens=32)
    messages.append({"role": "assistant", "content": reply.choices[0].message.content or ""})
    messages.append({"role": "user", "content": "Continue."})
print(messages[-2]["content"], flush=True)
if os.environ.get("INFO_FILE"):
    info = {"cwd": os.getcwd(), "session_id": os.environ["ENVHUB_SESSION_ID"]}
    with open(os.environ["INFO_FILE"] + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(os.environ["INFO_FILE"] + ".tmp", os.environ["INFO_FILE"])
time.sleep(float(os.environ.get("SLEEP", "0")))
sys.exit(int(os.environ.get("EXIT", "0")))
