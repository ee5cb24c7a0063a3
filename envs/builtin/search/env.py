"""`search`: multi-hop questions over an offline encyclopedia, answered with `search` and
`open_page` tools and graded by normalised exact match.

No sandbox: the corpus is a read-only SQLite index in the host's cache that the agent reaches
only through the tools; `submit` writes the answer to the rollout's in-process file store and
`verify` reads it back. The tasks are synthesised (synth.py) from the manifest's seeds, so the
same manifest always gives the same corpus and questions; the corpus digest is pinned there.

Free-form grading: the verdict's `output` is the submitted answer and the task row's `answer`
the reference, so a judge reward component (`[rewards.judge]`, envs/rewards/judge, with
`reference_field = "answer"`) can grade answers exact match finds too strict; the outcome stays
the exact match.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from envhub.envs.builtin.search import tools
from envhub.envs.builtin.search.index import Corpus, open_corpus
from envhub.envs.builtin.search.synth import (
    DIFFICULTY,
    Question,
    follow_hops,
    normalise,
    synthesize,
)
from envhub.envs.environment import RunContext, Task, ToolResult, Verdict
from envhub.envs.manifest import Manifest
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxFileError

ANSWER_PATH = "/answer.txt"
HINT = ("Find the answer in the encyclopedia: search for a name, open its page, follow the "
        "facts from page to page, then call submit with the answer only.")


@lru_cache(maxsize=4)
def questions(corpus_seed: int, seed: int, count: int,
              difficulties: tuple[str, ...]) -> list[Question]:
    """The validated questions of these seeds (synthesised once per process: a few seconds)."""
    corpus = open_corpus(corpus_seed)
    found, _ = synthesize(corpus.world, lambda name, args: tools.call(corpus.index, name, args),
                          seed, count, list(difficulties))
    if len(found) < count:
        raise ValueError(f"search: only {len(found)} of [metadata] count = {count} questions "
                         "pass validation; lower count or allow more difficulties")
    return found


class SearchEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder, self.manifest = folder, manifest
        meta = manifest.metadata
        self.corpus_seed = int(meta.get("corpus_seed", 0))
        self.seed = int(meta.get("seed", 0))
        self.count = int(meta.get("count", 600))
        self.difficulties = tuple(meta.get("difficulties", DIFFICULTY.values()))
        unknown = [d for d in self.difficulties if d not in DIFFICULTY.values()]
        if unknown or not self.difficulties:
            raise ValueError(f"search [metadata] difficulties: unknown {unknown}; choose from "
                             f"{list(DIFFICULTY.values())}")

    @property
    def corpus(self) -> Corpus:
        return open_corpus(self.corpus_seed)

    def load_tasks(self) -> list[Task]:
        pinned = self.manifest.metadata.get("corpus_sha256")
        if pinned and pinned != self.corpus.digest:
            raise ValueError(f"search: the corpus built from corpus_seed = {self.corpus_seed} "
                             f"has digest {self.corpus.digest}, not the pinned [metadata] "
                             f"corpus_sha256 = {pinned}; the generator (corpus.py) changed: "
                             "pin the new digest if that was meant")
        return [Task(id=q.id, instruction=f"{q.question}\n\n{HINT}", data=q.row())
                for q in questions(self.corpus_seed, self.seed, self.count, self.difficulties)]

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        return await ctx.open_sandbox(self.manifest.sandbox)

    def tools(self, task: Task) -> list[str]:
        return list(self.manifest.tools)

    def tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        return [tools.SCHEMAS[name] for name in self.tools(task) if name in tools.SCHEMAS]

    async def call_tool(self, task: Task, name: str, arguments: str, sandbox: Sandbox,
                        state: dict[str, Any]) -> ToolResult:
        if name != "submit":
            return tools.call(self.corpus.index, name, arguments)
        answer = tools.read_answer(arguments)
        if isinstance(answer, ToolResult):
            return answer
        if await _submitted(sandbox) is not None:  # the first answer stands
            return ToolResult("already submitted; the first answer stands", is_error=True,
                              submitted=True)
        await sandbox.write_file(ANSWER_PATH, answer.encode())
        return ToolResult(f"submitted {answer}", submitted=True)

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        """The oracle: follow the recorded hops through the same tools the model calls and
        submit what the last page says (nothing, if the hops no longer lead there)."""
        found = follow_hops(task.data["hops"],
                            lambda name, args: tools.call(self.corpus.index, name, args))
        if found is not None:
            await self.call_tool(task, "submit", json.dumps({"answer": found}), sandbox, {})

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        expected = str(task.data["answer"])
        info: dict[str, Any] = {"question": task.data["question"], "expected": expected,
                                "difficulty": task.data["difficulty"]}
        submitted = await _submitted(sandbox)
        if submitted is None:
            return Verdict(0.0, False, {**info, "reason": "no answer submitted"})
        resolved = normalise(submitted) == normalise(expected)
        return Verdict(1.0 if resolved else 0.0, resolved, {**info, "submitted": submitted},
                       output=submitted)


async def _submitted(sandbox: Sandbox) -> str | None:
    """The submitted answer (read with a cap: only `submit` writes it), None before one."""
    try:
        data = await sandbox.read_file(ANSWER_PATH, limit=4 * tools.MAX_ANSWER_CHARS)
    except SandboxFileError:
        return None
    return data.decode(errors="replace")[:tools.MAX_ANSWER_CHARS]
