"""What the gateway's conversation classifier (gateway/history.py) costs per request, at turn 1
and turn 128 of a session, before issue 40 (git revision BEFORE) and now, side by side in one
run. It runs on every call: `History.plan` for a request that extends the history (the common
case), one that rewrites it (its first exchange moved after the history, as aider moves its
file block: extends nothing, classified against every chain), and one that starts a new
conversation (every rule tried). Message hashes and the sampled turns are made here: no
gateway, tokenizer or engine.

    python bench/bench_classify.py [--before 5a974b5] [--repeats 200]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINTS = (1, 128)


def load(revision: str | None) -> ModuleType:
    """gateway/history.py now (None) or at `revision`, as a module of its own."""
    if revision is None:
        from envhub.gateway import history
        return history
    text = subprocess.run(["git", "show", f"{revision}:gateway/history.py"], cwd=ROOT,
                          capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / f"history_{revision}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)
    return module


def h(tag: str) -> bytes:
    return tag.encode().ljust(16, b".")[:16]


class Session:
    """A History grown turn by turn as the gateway grows it: aider-shaped messages (a system
    prompt, the task, then user / assistant pairs), one sampled turn per request."""

    def __init__(self, mod: ModuleType):
        self.mod, self.history = mod, mod.History()
        self.tools = h("tools")
        self.msgs: list[tuple[bytes, str, str]] = [
            (h("sys"), "system", "Act as an expert software developer."),
            (h("task"), "user", "add a greeting")]
        self.texts = "long enough sampled reply number "
        self.takes_text = "text" in inspect.signature(self.history.plan).parameters

    def plan(self, msgs: list[tuple[bytes, str, str]], preview: bool = False):
        kw = {"text": lambda i: msgs[i][2]} if self.takes_text else {}
        return self.history.plan([m[0] for m in msgs], self.tools, lambda i: msgs[i][1],
                                 consume_declared=not preview, **kw)

    def turn(self, k: int) -> None:
        p = self.plan(self.msgs)
        hist = self.history
        parent = p.parent if p.kind == "extend" else None
        seqs, segments = hist.allocate(1, parent)
        response = h(f"resp{k}")
        fields = dict(seq=seqs[0], segment=segments[0], parent=parent, delta_ids=[1] * 20,
                      completion_ids=[2] * 30, appended_hashes=p.appended_hashes,
                      response_hash=response, tools_key=self.tools)
        if "response_text" in inspect.signature(self.mod.TurnState).parameters:
            fields["response_text"] = f"{self.texts}{k}"
        state = self.mod.TurnState(**fields)
        hist.add(state, hist.request_key(parent, self.tools, p.appended_hashes), len(self.msgs),
                 p.action)
        self.msgs += [(response, "assistant", f"{self.texts}{k}"),
                      (h(f"user{k}"), "user", f"request {k}")]

    def requests(self) -> dict[str, list[tuple[bytes, str, str]]]:
        m = self.msgs  # rewrite: the first exchange moved after the history (aider's shape)
        return {"extend": m,
                "rewrite": m[:2] + m[4:-1] + m[2:4] + m[-1:] if len(m) > 4 else m[:1] + m[2:],
                "new": [self.msgs[0], (h("other"), "user", "another task entirely")]}


def measure(mod: ModuleType, turns: int, kind: str, repeats: int) -> float:
    """Median µs of one `plan` call (a preview: nothing recorded) at turn `turns`."""
    s = Session(mod)
    for k in range(turns - 1):
        s.turn(k)
    msgs = s.requests()[kind]
    times = []
    for _ in range(repeats):
        s.history._last = ([], [])  # each request's rolling hashes from scratch (worst case)
        t0 = time.perf_counter()
        s.plan(msgs, preview=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="5a974b5")
    ap.add_argument("--repeats", type=int, default=200)
    args = ap.parse_args()
    before, now = load(args.before), load(None)
    print(f"classification cost per request, median of {args.repeats} (µs); before = "
          f"{args.before}, pid {os.getpid()}")
    print(f"{'request':<9}{'turn':>6}{'before':>10}{'now':>10}{'now/before':>12}")
    for kind in ("extend", "rewrite", "new"):
        for turns in CHECKPOINTS:
            a = measure(before, turns, kind, args.repeats)
            b = measure(now, turns, kind, args.repeats)
            print(f"{kind:<9}{turns:>6}{a:>10.1f}{b:>10.1f}{b / a:>11.2f}x")


if __name__ == "__main__":
    main()
