"""Runs the graded test command as a child and watches it from outside (`python3 -I`, stdlib only).

    python3 -I envhub_grade_wrapper.py LIMIT -- sh -c COMMAND

What the code under test cannot reach, because it lives in this process:
1. The per-test time limit. The pytest plugin (envhub_test_timeout) says on a pipe when each
   test starts and ends; a test still running LIMIT * 1.5 + 5 seconds after it started (the
   in-process alarm fires at LIMIT, unless the test spins in C code where no Python signal
   handler runs) has its whole process group killed here.
2. What the plugin's audit hook saw: its findings arrive on the same pipe the moment they
   happen, before the code that caused them gets control back, so no later act of that code
   can take them back.
3. The report: the first line this prints holds a random nonce; after the child is gone the
   last one holds the nonce again with what was seen, as JSON. The child never learns the
   nonce, so it cannot print a report of its own.
The exit status is the child's (124 when the limit killed it). Compatible with Python >= 3.6.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

MAX_LINE = 4096
MAX_FINDINGS = 20
PREFIX = "ENVHUB-WRAPPER"


class Watch:
    def __init__(self, limit):
        self.limit = limit * 1.5 + 5.0
        self.test, self.started = None, 0.0
        self.killed, self.bye = None, False
        self.findings = []
        self.buffer = b""

    def feed(self, data):
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self.message(line[:MAX_LINE].decode("utf-8", "replace"))
        self.buffer = self.buffer[-MAX_LINE:]

    def message(self, line):
        kind, _, text = line.partition(" ")
        if kind == "start":
            self.test, self.started = text, time.monotonic()
        elif kind == "end":
            self.test = None
        elif kind == "bye":
            self.bye = True
        elif kind == "finding" and len(self.findings) < MAX_FINDINGS:
            self.findings.append(text)

    def overdue(self):
        return self.test is not None and time.monotonic() - self.started > self.limit


def main(argv):
    limit = float(argv[1])
    command = argv[argv.index("--") + 1:]
    nonce = os.urandom(16).hex()
    print("%s %s begin" % (PREFIX, nonce), flush=True)
    read, write = os.pipe()
    env = dict(os.environ, ENVHUB_WATCH_FD=str(write))
    child = subprocess.Popen(command, pass_fds=(write,), env=env, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    os.close(write)
    watch, open_, exited = Watch(limit), True, None
    while True:
        if child.poll() is not None:
            if exited is None:
                exited = time.monotonic()
                _kill_group(child.pid)  # what the run left behind in its group
            if not open_ or time.monotonic() - exited > 2.0:
                break  # a process outside the group holding the pipe is not waited for
        if open_ and select.select([read], [], [], 0.2)[0]:
            data = os.read(read, 65536)
            open_ = bool(data)
            watch.feed(data)
        elif not open_:
            try:
                child.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        if watch.overdue() and watch.killed is None:
            watch.killed = watch.test
            _kill_group(child.pid)
    report = {"exit": child.returncode, "killed": watch.killed, "bye": watch.bye,
              "limit_s": watch.limit, "findings": watch.findings}
    sys.stdout.flush()
    print("\n%s %s end %s" % (PREFIX, nonce, json.dumps(report)), flush=True)
    if watch.killed:
        return 124
    return child.returncode if child.returncode >= 0 else 128 - child.returncode


def _kill_group(pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))
