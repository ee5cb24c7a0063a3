"""`arith`: arithmetic word problems solved with a `calculator` tool, graded by exact answer.

No sandbox: the runner hands `setup` an in-process file store (`[sandbox] kind = "none"`);
`submit` writes the answer there and `verify` reads it back, so the oracle, the built-in agent
and the verifier all meet at the same file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envhub.envs.builtin.arith.calculator import (
    CalculatorError,
    evaluate,
    format_number,
    parse_answer,
)
from envhub.envs.builtin.arith.problems import FAMILIES, generate
from envhub.envs.environment import RunContext, Task, ToolResult, Verdict
from envhub.envs.manifest import Manifest
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import SandboxFileError

ANSWER_PATH = "/answer.txt"
SYSTEM_HINT = ("Use the calculator tool for every computation, then call submit with the final "
               "number only.")

SCHEMAS: dict[str, dict[str, Any]] = {
    "calculator": {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression exactly (+ - * / // % ** and "
                       "parentheses). Returns the value.",
        "parameters": {"type": "object", "properties": {
            "expression": {"type": "string", "description": "e.g. '12 * (3 + 4)'"}},
            "required": ["expression"]},
    }},
    "submit": {"type": "function", "function": {
        "name": "submit",
        "description": "Submit the final answer (a number) and end the episode.",
        "parameters": {"type": "object", "properties": {
            "answer": {"type": "string", "description": "the final number, e.g. '42'"}},
            "required": ["answer"]},
    }},
}


class ArithEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = folder
        self.manifest = manifest
        self.seed = int(manifest.metadata.get("seed", 0))
        self.count = int(manifest.metadata.get("count", 512))
        self.families = list(manifest.metadata.get("families", FAMILIES))
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"arith [metadata] families: unknown {unknown}; choose from "
                             f"{sorted(FAMILIES)}")

    def load_tasks(self) -> list[Task]:
        return [
            Task(id=p.id, instruction=f"{p.question}\n\n{SYSTEM_HINT}",
                 data={"answer": p.answer, "steps": p.steps, "question": p.question,
                       "family": p.family})
            for p in generate(self.seed, self.count, self.families)
        ]

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        return await ctx.open_sandbox(self.manifest.sandbox)

    def tools(self, task: Task) -> list[str]:
        return list(self.manifest.tools)

    def tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        return [SCHEMAS[name] for name in self.tools(task) if name in SCHEMAS]

    async def call_tool(
        self, task: Task, name: str, arguments: str, sandbox: Sandbox, state: dict[str, Any]
    ) -> ToolResult:
        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as e:
            return ToolResult(f"arguments are not valid JSON ({e.msg}); pass an object such as "
                              '{"expression": "2 + 2"}', is_error=True)
        if not isinstance(args, dict):
            return ToolResult("arguments must be a JSON object", is_error=True)
        if name == "calculator":
            try:
                return ToolResult(format_number(evaluate(str(args.get("expression", "")))))
            except CalculatorError as e:
                return ToolResult(f"error: {e}", is_error=True)
        if name == "submit":
            answer = str(args.get("answer", "")).strip()
            if not answer:
                return ToolResult('pass the final number as {"answer": "42"}', is_error=True)
            await sandbox.write_file(ANSWER_PATH, answer.encode())
            return ToolResult(f"submitted {answer}", submitted=True)
        return ToolResult(f"unknown tool {name!r}; use calculator or submit", is_error=True)

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        await sandbox.write_file(ANSWER_PATH, str(task.data["answer"]).encode())

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        try:
            submitted = (await sandbox.read_file(ANSWER_PATH)).decode(errors="replace")
        except SandboxFileError:
            return Verdict(0.0, False, {"reason": "no answer submitted"})
        value = parse_answer(submitted)
        resolved = value is not None and value == int(task.data["answer"])
        return Verdict(1.0 if resolved else 0.0, resolved,
                       {"submitted": submitted[:100], "expected": task.data["answer"]},
                       output=submitted[:2000])  # for a model judge ([rewards.judge])
