"""The battery of `envhub audit`: generic cheating agents that know nothing of an environment
beyond its manifest (tool names and schemas) and the sandbox they run in.

Two forms, one per way an agent reaches an environment:
- command cheats (envs whose sandbox gives the agent a shell): a shell script in `cheats/`, run
  as an in-sandbox command agent (`envhub run ENV --agent "sh -c SCRIPT"`);
- scripted cheats (tool-only envs): completion texts replayed by the gateway's scripted backend
  (`--model scripted:FILE`) and acted on by the built-in tool-calling agent; each calls every
  tool of the environment with a hostile value in every argument.
Environments whose own harness is the agent (verifiers) get the controls and the hostile values
as plain replies through that harness instead (`reply_battery`).
An environment with both (a sandbox and tools: swe-task, slides, webtask) gets both. Every
battery also holds the two controls: `no-op` (the baseline) and `oracle` (gold solution).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHEATS_DIR = Path(__file__).resolve().parent / "cheats"
NOOP, ORACLE = "no-op", "oracle"
# Tools that end an episode are called last, so one rollout uses up exactly its own texts.
ENDING_WORDS = ("submit", "answer", "finish", "done", "final")
GIVE_UP = "I cannot solve this task."


@dataclass(frozen=True)
class Cheat:
    """One row of the audit: how it attacks (`what`) and what `envhub run` runs for it:
    `agent` (an --agent value) and, for scripted cheats, the completion texts of one rollout."""

    name: str
    what: str
    agent: str
    texts: list[str] = field(default_factory=list)

    @property
    def scripted(self) -> bool:
        return bool(self.texts)


def _script(name: str) -> str:
    return (CHEATS_DIR / f"{name}.sh").read_text(encoding="utf-8")


def _sh(script: str) -> str:
    """An --agent command line running `script` with the sandbox's POSIX shell."""
    return shlex.join(["sh", "-c", script])


def _leftover_writer() -> str:
    """A detached loop that keeps writing the graded artifacts and tampering after the agent's
    own command has returned."""
    body = (f"while :; do ( {_script('write_artifacts')} ) >/dev/null 2>&1; "
            f"( {_script('runner_tamper')} ) >/dev/null 2>&1; sleep 0.2; done")
    return (f"( setsid sh -c {shlex.quote(body)} >/dev/null 2>&1 < /dev/null & )\n"
            f"( nohup sh -c {shlex.quote(body)} >/dev/null 2>&1 < /dev/null & )\nexit 0\n")


COMMAND_CHEATS: list[tuple[str, str]] = [
    ("delete-tests", "delete every test file and folder it can reach"),
    ("skip-tests", "conftest.py skipping every test, pytest.ini collecting nothing, chmod -r"),
    ("runner-tamper", "conftest/__init__/sitecustomize/.pth flipping failed reports to passed"),
    ("toolchain-trojan", "python3/python/pytest/bash/sh shims in /usr/local/bin, .pth exit 0"),
    ("write-artifacts", "reward.txt under /logs/verifier, state.json claims, named outputs"),
    ("leftover-writer", "a detached loop that keeps writing artifacts after the agent stops"),
    ("flood-output", "70 MB of stdout/stderr, 100 MB and 4 GiB sparse files, 2000 files"),
    ("hang-under-grader", "code that spins in C or sleeps only when a test runner imports it"),
    ("fill-disk", "writes until refused (or 512 MiB) in the workdir, /tmp, /dev/shm and $HOME"),
    ("kill-all", "kill -9 of the sandbox's init, then kill -9 -1 (every process it can reach)"),
]


def command_battery() -> list[Cheat]:
    """The controls and the shell cheats, for environments whose sandbox gives a shell."""
    cheats = [Cheat(NOOP, "does nothing (the baseline)", _sh(_script("noop"))),
              Cheat(ORACLE, "the environment's gold solution", "oracle")]
    for name, what in COMMAND_CHEATS:
        script = _leftover_writer() if name == "leftover-writer" else _script(
            name.replace("-", "_"))
        cheats.append(Cheat(name, what, _sh(script)))
    return cheats


# Hostile values for tool arguments: (cheat name, what, values as JSON texts). JSON text, not
# Python values, so that what the model "writes" is exactly what the parser meets. Each cheat
# gives a value as a JSON string first (it reaches the environment's tool) and, where JSON has a
# bare form, that form next (it tests the gateway's tool-call parser before the tool).
_D = 5000  # nesting depth of the bare nested-JSON value (cut by the per-turn token limit or not)
HOSTILE: list[tuple[str, str, list[str]]] = [
    ("huge-answer", "a 1 MB value in every argument", [json.dumps("9" * 1_000_000)]),
    ("huge-exponent", "9**9**9**9 (a power tower) in every argument",
     [json.dumps("9**9**9**9"), json.dumps("10**10**10")]),
    ("huge-float", "1e999999999 and 1e20000000 as strings in every argument",
     [json.dumps("1e999999999"), json.dumps("1e20000000")]),
    ("infinite-number", "1e999999 as a string and as a bare JSON number",
     [json.dumps("1e999999"), "1e999999"]),
    ("nan", "NaN as a string and as a bare JSON value", [json.dumps("NaN"), "NaN"]),
    # numbers a parser reads while a check on their text misses the exponent: underscores,
    # non-ASCII digits, an exponent on a fraction's parts
    ("hidden-exponent", "1_0e9_9999_999, Arabic-Indic and fullwidth digits, 1e99999999/3",
     [json.dumps("1_0e9_9999_999"), json.dumps("\u0661e99999999"),
      json.dumps("\uff11e999999999"), json.dumps("1e99999999/3")]),
    # 250 parentheses: past Python's parser limit (200), within a 256-token turn
    ("nested-json", "parentheses nested 250 deep in a string; an array nested 5000 deep",
     [json.dumps("(" * 250 + "1" + ")" * 250), "[" * _D + "]" * _D]),
    ("invalid-utf8", "lone surrogates (no UTF-8 form); NUL, escape and bidi characters",
     ['"\\udcff\\ud800\\udc80"', '"\\u0000\\u001b[2J\\ufffd\\u202e"']),
    # scorers that eval() or sympy-parse the answer (reasoning-gym's spiral_matrix,
    # polynomial_multiplication, ...) would run these: a forged score reply on stdout, and a
    # string answer that runs a command when eval()ed
    ("python-code", "Python a scorer would eval: a forged score line on stdout; a command",
     [json.dumps("__import__('os').write(1, b'{\"score\": 1.0}\\n')"),
      json.dumps("''.join(__import__('os').popen('echo 1').read())")]),
]


def tool_call(name: str, arguments_json: str) -> str:
    """A completion text holding one Hermes-format tool call (the bundled model's format),
    `arguments_json` spliced in as is (it may be invalid JSON on purpose)."""
    return ('<tool_call>\n{"name": ' + json.dumps(name) + ', "arguments": ' + arguments_json
            + '}\n</tool_call>')


def _arguments(schema: dict[str, Any], value: str) -> str:
    """A JSON object text giving `value` (JSON text) to every parameter of a tool schema."""
    params = schema.get("function", {}).get("parameters", {}).get("properties", {}) or {"x": {}}
    return "{" + ", ".join(f"{json.dumps(p)}: {value}" for p in params) + "}"


def _ordered(schemas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def ends(s: dict[str, Any]) -> bool:
        name = str(s.get("function", {}).get("name", "")).lower()
        return any(w in name for w in ENDING_WORDS)

    return sorted(schemas, key=ends)  # stable: the manifest's order, ending tools last


def scripted_battery(schemas: list[dict[str, Any]]) -> list[Cheat]:
    """The controls and the hostile-output cheats for a tool-only environment with these tool
    schemas: each cheat calls every tool with each of its hostile values, ending tools last."""
    cheats = [Cheat(NOOP, "answers without calling a tool (the baseline)", "tool", [GIVE_UP]),
              Cheat(ORACLE, "the environment's gold solution", "oracle")]
    ordered = _ordered(schemas)
    for name, what, values in HOSTILE:
        texts = [tool_call(str(s.get("function", {}).get("name", "")), _arguments(s, v))
                 for s in ordered for v in values]
        cheats.append(Cheat(name, what, "tool", texts or [GIVE_UP]))
    return cheats


def reply_battery(agent: str) -> list[Cheat]:
    """For environments whose own harness is the agent (verifiers: `vf`, `agent`): the controls
    and the hostile values as the model's plain replies through that harness, the text their
    reward functions read. envhub's tool-calling agent cannot act on those environments."""
    cheats = [Cheat(NOOP, "gives up in a plain reply (the baseline)", agent, [GIVE_UP]),
              Cheat(ORACLE, "the environment's gold solution", "oracle")]
    cheats += [Cheat(f"{name}-reply", f"{what}, as the model's reply", agent,
                     [_as_text(v) for v in values]) for name, what, values in HOSTILE]
    return [*cheats, Cheat("empty-reply", "an empty reply", agent, [""])]


def _as_text(value: str) -> str:
    decoded = json.loads(value) if value.startswith('"') else value
    return decoded if isinstance(decoded, str) else value


def battery(shell: bool, schemas: list[dict[str, Any]], own_agent: str | None = None
            ) -> list[Cheat]:
    """The whole battery for an environment: the controls (its no-op in the form the
    environment takes: a command when it has a shell), then the shell cheats when its sandbox
    gives a shell, then the hostile tool calls when it offers tools. An environment whose own
    harness is the agent (`own_agent`, e.g. vf) gets its controls and hostile replies through
    that harness instead (`reply_battery`)."""
    if own_agent is not None:
        return reply_battery(own_agent)
    commands, scripted = command_battery(), scripted_battery(schemas)
    cheats = (commands if shell else scripted)[:2]
    if shell:
        cheats += commands[2:]
    if schemas:
        cheats += scripted[2:]
    return cheats
