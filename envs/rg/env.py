"""`ReasoningGymEnv`: one reasoning-gym dataset (its spec in the manifest's [metadata]) as an
environment: each entry's question is a task, the agent answers with `submit(answer)`, and the
dataset's own `score_answer` grades it: outcome 1 for a full score, else 0 (the score itself in
info["score"]; with the spec's `partial`, the score is the outcome).

No sandbox (`[sandbox] kind = "none"`): `submit` writes the answer to the rollout's in-process
file store and `verify` reads it back (capped), as in arith and search. Grading follows the
rule of envs/environment.py: the verdict depends only on the submitted answer and on the entry
regenerated host-side from (dataset, seed, config, index), never on anything the rollout held
(a regenerated question that differs from the task's is env_failure: the generator is not
deterministic). Entries are generated and answers scored in worker processes (scorer.py), with
the spec's time limit per answer. An answer the scorer would run as Python that is not a plain
expression is refused unscored (screen.py); it, and an answer that makes the scorer raise,
overrun or misbehave, scores 0 with the `ungradable_output` signal, unless the gold answer fails
the same way (then the scorer is broken: env_failure).
"""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

from envhub.envs.environment import UNGRADABLE, RunContext, Task, ToolResult, Verdict
from envhub.envs.errors import EnvLoadError
from envhub.envs.manifest import Manifest
from envhub.envs.rg.scorer import Scored, ScorerPool, pool
from envhub.envs.rg.screen import mode_for, refusal
from envhub.envs.rg.spec import RGSpec, dataset, tag
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxFileError
from envhub.sdk.types import Signal

ANSWER_PATH = "/answer.txt"
MAX_ANSWER_CHARS = 2000  # longer answers are refused by `submit`, never cut (a cut could match)
ENTRIES_PER_REQUEST = 1000
HINT = "When you have the answer, call the submit tool with the final answer only."
SUBMIT = {"type": "function", "function": {
    "name": "submit",
    "description": "Submit your final answer and end the task. Call it once.",
    "parameters": {"type": "object", "properties": {
        "answer": {"type": "string", "description": "the final answer only, e.g. '42'"}},
        "required": ["answer"]},
}}


class ReasoningGymEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder, self.manifest = folder, manifest
        self.spec = RGSpec.from_metadata(manifest.metadata, f"{folder}/envhub.toml")
        self.scorer: ScorerPool = pool()
        self._entries: dict[int, dict[str, Any]] = {}
        self._gold: dict[int, Scored] = {}  # the gold answer's score per entry, once

    @property
    def dataset(self) -> Any:
        return dataset(self.spec)

    def entry(self, index: int) -> dict[str, Any]:
        """Entry `index` (JSON-safe) as the workers regenerate it from the spec (reasoning-gym
        seeds each entry from the dataset's seed and the index; the workers fix the hash seed)."""
        if index not in self._entries:
            self._fetch(index, index + 1)
        return self._entries[index]

    def _fetch(self, start: int, stop: int) -> None:
        try:
            entries = self.scorer.entries(self.spec.key, start, stop)
        except RuntimeError as e:
            raise EnvLoadError(f"rg:{self.spec.dataset}: {e}") from None
        self._entries.update(zip(range(start, stop), entries, strict=True))

    def load_tasks(self) -> list[Task]:
        size = self.spec.size
        for start in range(0, size, ENTRIES_PER_REQUEST):
            self._fetch(start, min(size, start + ENTRIES_PER_REQUEST))
        return [self._task(i, self._entries[i]) for i in range(size)]

    def _task(self, index: int, entry: dict[str, Any]) -> Task:
        meta = entry.get("metadata") or {}
        data = {"dataset": self.spec.dataset, "index": index, "question": entry["question"],
                "answer": entry.get("answer"), "difficulty": meta.get("difficulty"),
                "metadata": meta}
        label = "-".join(filter(None, (self.spec.dataset, tag(self.spec), str(self.spec.seed))))
        return Task(id=f"{label}-{index:05d}", instruction=f"{entry['question']}\n\n{HINT}",
                    data=data)

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        return await ctx.open_sandbox(self.manifest.sandbox)

    def tools(self, task: Task) -> list[str]:
        return list(self.manifest.tools)

    def tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        return [json.loads(json.dumps(SUBMIT))] if "submit" in self.tools(task) else []

    async def call_tool(self, task: Task, name: str, arguments: str, sandbox: Sandbox,
                        state: dict[str, Any]) -> ToolResult:
        if name != "submit":
            return ToolResult(f"unknown tool {name!r}; call submit with your answer",
                              is_error=True)
        answer = read_answer(arguments)
        if isinstance(answer, ToolResult):
            return answer
        if await submitted(sandbox) is not None:  # the first answer stands
            return ToolResult("already submitted; the first answer stands", is_error=True,
                              submitted=True)
        # lone surrogates (JSON allows them, UTF-8 does not) become "?"
        await sandbox.write_file(ANSWER_PATH, answer.encode(errors="replace"))
        return ToolResult(f"submitted {answer}", submitted=True)

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        """The oracle: submit the entry's gold answer (datasets without one, whose scorer checks
        an answer's validity instead, have no oracle)."""
        entry = await asyncio.to_thread(self.entry, int(task.data["index"]))
        gold = entry.get("answer")
        if gold is not None:
            await self.call_tool(task, "submit", json.dumps({"answer": str(gold)}), sandbox, {})

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        index = int(task.data["index"])
        entry = await asyncio.to_thread(self.entry, index)
        info: dict[str, Any] = {"dataset": self.spec.dataset, "index": index,
                                "expected": entry.get("answer")}
        if entry["question"] != task.data["question"]:
            return Verdict(0.0, False, info, env_failure=(
                f"reasoning-gym {self.spec.dataset} regenerated entry {index} differently from "
                "the task (its generator is not deterministic for this seed)"))
        answer = await submitted(sandbox)
        if answer is None:
            return Verdict(0.0, False, {**info, "reason": "no answer submitted"})
        info["submitted"] = answer  # capped at MAX_ANSWER_CHARS
        mode = mode_for(self.dataset, entry)
        refused = refusal(answer, mode) if mode else None
        scored = Scored(error=refused) if refused else await self._score(answer, index)
        if scored.failure is not None:
            return Verdict(0.0, False, info, env_failure=scored.failure)
        if scored.error is None:
            info["score"] = scored.score  # the scorer's own value, whatever the outcome takes
            full = scored.score >= 1.0
            outcome = scored.score if self.spec.partial else float(full)
            return Verdict(outcome, full, info, output=answer)
        control = await self._gold_score(index, entry) if not refused else None
        if control is not None and (control.error or control.failure):
            return Verdict(0.0, False, info, env_failure=f"the scorer fails on the gold answer "
                           f"too: {control.error or control.failure}")
        return Verdict(0.0, False, {**info, "reason": scored.error}, output=answer,
                       signals=[Signal(name=UNGRADABLE, info={"error": scored.error})])

    async def _gold_score(self, index: int, entry: dict[str, Any]) -> Scored | None:
        """The gold answer's score (the control for an answer the scorer failed on), computed
        once per entry; None for an entry without a gold answer."""
        gold = entry.get("answer")
        if gold is None:
            return None
        if index in self._gold:
            return self._gold[index]
        scored = await self._score(str(gold), index)
        if scored.error is None and scored.failure is None:  # a failure may pass: ask again
            self._gold[index] = scored
        return scored

    async def _score(self, answer: str, index: int) -> Scored:
        """The dataset's score of `answer` to entry `index` (clamped to [0, 1]), computed in a
        scorer worker (scorer.py) within the spec's score_timeout_s."""
        scored = await asyncio.to_thread(self.scorer.score, self.spec.key, index, answer,
                                         self.spec.score_timeout_s)
        value = scored.score
        scored.score = min(1.0, max(0.0, value)) if math.isfinite(value) else 0.0
        return scored


def read_answer(arguments: str) -> str | ToolResult:
    """A `submit` call's answer (stripped, at most MAX_ANSWER_CHARS), or the error to send back."""
    example = '{"answer": "42"}'
    try:
        args = json.loads(arguments or "{}")
    except ValueError as e:
        return ToolResult(f"arguments are not valid JSON ({e}); send e.g. {example}",
                          is_error=True)
    answer = args.get("answer") if isinstance(args, dict) else None
    if isinstance(answer, int | float) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        return ToolResult(f"pass the final answer as a string, e.g. {example}", is_error=True)
    if len(answer) > MAX_ANSWER_CHARS:
        return ToolResult(f"answer longer than {MAX_ANSWER_CHARS} characters; submit the final "
                          "answer only", is_error=True)
    return answer.strip()


async def submitted(sandbox: Sandbox) -> str | None:
    """The submitted answer (read with a cap: only `submit` writes it), None before one."""
    try:
        data = await sandbox.read_file(ANSWER_PATH, limit=4 * MAX_ANSWER_CHARS)
    except SandboxFileError:
        return None
    return data.decode(errors="replace")[:MAX_ANSWER_CHARS]
