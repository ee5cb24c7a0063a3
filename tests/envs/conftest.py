"""Helpers shared by the envs tests: the swe-task harness (test_swe_env, test_reward_hacks)."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

from envhub.envs.environment import RunContext, Task, Verdict
from envhub.envs.loader import load_env
from envhub.envs.manifest import SandboxSpec
from envhub.envs.sandbox import Sandbox, open_sandbox
from envhub.envs.swe.task import SWETask
from tests.support import require_docker, require_tool

# data/ holds task folders as users write them; their own tests/test_outputs.py run inside task
# sandboxes, never in this suite.
collect_ignore_glob = ["data/*"]

Act = Callable[[Sandbox, "SWEHarness", Task], Awaitable[None]]

class SWEHarness:
    """Loads swe-task and runs setup → act → verify like the runner does."""

    def __init__(self, kind: str, scratch: Path) -> None:
        self.kind = kind
        self.loaded = load_env("swe-task")
        self.env = self.loaded.env
        self.tasks = {t.id: t for t in self.env.load_tasks()}
        self.scratch = scratch
        self.opened: list[Sandbox] = []

    async def open(self, spec: SandboxSpec) -> Sandbox:
        box = await open_sandbox(self.kind, spec, run_id="test-swe",  # type: ignore[arg-type]
                                 package_root=self.loaded.folder)
        self.opened.append(box)
        return box

    def ctx(self) -> RunContext:
        return RunContext(run_id="test-swe", sandbox_kind=self.kind, open_sandbox=self.open,
                          scratch=self.scratch)

    def swe(self, task_id: str) -> SWETask:
        return self.env.swe_task(self.tasks[task_id])

    async def rollout(self, task_id: str, act: Act | None) -> Verdict:
        task = self.tasks[task_id]
        ctx = self.ctx()
        try:
            sandbox = await self.env.setup(task, ctx)
            if act is not None:
                await act(sandbox, self, task)
            return await self.env.verify(task, sandbox, ctx)
        finally:
            while self.opened:
                await self.opened.pop().close()


async def oracle(sandbox: Sandbox, h: SWEHarness, task: Task) -> None:
    await h.env.solve(task, sandbox, h.ctx())


def kind_available(kind: str) -> None:
    if kind == "local":
        require_tool("bwrap")
    else:
        require_docker()


# A small environment package (test_loader.py, test_manifest_values.py)
MANIFEST = """
name = "pkg"
version = "1.0.0"
entrypoint = "main:Env"
[tasks]
path = "tasks.jsonl"
"""
ENTRYPOINT = """
from envhub.envs.loader import rows_to_tasks, task_rows
from .helper import PREFIX

class Env:
    def __init__(self, folder, manifest):
        self.folder, self.manifest = folder, manifest
    def load_tasks(self):
        return rows_to_tasks(task_rows(self.folder, self.manifest.tasks))
    async def setup(self, task, ctx): ...
    def tools(self, task): return [PREFIX]
    async def solve(self, task, sandbox, ctx): ...
    async def verify(self, task, sandbox, ctx): ...
"""


def make_pkg(root: Path, manifest: str = MANIFEST, entry: str = ENTRYPOINT) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "envhub.toml").write_text(manifest)
    (root / "main.py").write_text(entry)
    (root / "helper.py").write_text("PREFIX = 'submit'\n")
    rows = [{"instance_id": "a-1", "problem_statement": "fix it", "extra": 1},
            {"id": "b-2", "instruction": "do it"}]
    (root / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


# arith with its own reward component (test_rewards.py, test_runner.py)
BREVITY = '''
from envhub.sdk.types import RewardEvent


class Brevity:
    """-0.1 per turn: an environment's own component, listed in its manifest."""

    def score(self, group, weights):
        return [[RewardEvent(kind="custom", name="brevity", value=-0.1 * len(s.turn_seqs))]
                for s in group]
'''


def arith_with(tmp_path, rewards: str, module: str = BREVITY):
    """A copy of the built-in arith package whose manifest's [rewards] reads `rewards`."""
    import re
    import shutil

    from envhub.envs.loader import resolve_folder

    folder = tmp_path / "arith-own"
    shutil.copytree(resolve_folder("arith"), folder, ignore=shutil.ignore_patterns("__pycache__"))
    toml = (folder / "envhub.toml").read_text()
    toml = re.sub(r"\[rewards\]\n(?:[^\[\n][^\n]*\n)*", "[rewards]\n" + rewards + "\n\n", toml)
    (folder / "envhub.toml").write_text(toml)
    (folder / "rewards.py").write_text(module)
    return folder
