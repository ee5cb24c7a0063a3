"""The construction pipeline: pinned sdists in, `tasks.jsonl` + snapshots out.

Deterministic: candidates are ordered by a seeded RNG over a stably sorted list, commits use
a fixed identity and date, archives have zeroed metadata, rows are written with sorted keys.
"""

from __future__ import annotations

import ast
import json
import random
import re
import subprocess
import tempfile
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.envs.swe.construct.config import PipelineConfig, Project
from envhub.envs.swe.construct.mutate import Mutation, mutations
from envhub.envs.swe.construct.patches import file_diff, new_files_patch
from envhub.envs.swe.construct.sdist import deterministic_targz, fetch_sdist, snapshot_files
from envhub.envs.swe.construct.statement import problem_statement
from envhub.envs.swe.construct.testrun import (
    RUN_ENV,
    failure_excerpts,
    run_tests,
    write_tree,
)
from envhub.envs.swe.logparse import PASSED
from envhub.envs.swe.repo import SCRIPTS
from envhub.envs.swe.task import SWETask

REPO_DIR = "/workspace/testbed"
CREATED_AT = "2026-11-21T00:00:00Z"
BASE_TEST_CMD = "python3 -P -m pytest -rA --tb=no -p no:cacheprovider"
Log = Callable[[str], None]


class PipelineError(RuntimeError):
    """The pipeline cannot produce a valid task set; the message says what to change."""


@dataclass
class Candidate:
    mutation: Mutation
    f2p: list[str]
    p2p: list[str]
    hidden: list[str]


def test_arguments(root: Path, files: list[str]) -> dict[tuple[str, str], set[str]]:
    """(file, test function name) → its parameter names, read from the test sources."""
    out: dict[tuple[str, str], set[str]] = {}
    for rel in files:
        for node in ast.walk(ast.parse((root / rel).read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names = {a.arg for a in node.args.args + node.args.kwonlyargs}
                out.setdefault((rel, node.name), set()).update(names)
    return out


def stable_id(test_id: str, arguments: dict[tuple[str, str], set[str]]) -> bool:
    """False for ids pytest generates from object positions (`expected8`): their numbering
    differs between pytest versions (7 in the Debian image, newer in the venv), so such a test
    would be "missing" in one sandbox and present in the other."""
    if " " in test_id:
        return False
    path, _, rest = test_id.partition("::")
    name, _, params = rest.split("::")[-1].partition("[")
    if not params:
        return True
    args = arguments.get((path, name), set())
    for part in params.rstrip("]").split("-"):
        match = re.fullmatch(r"([A-Za-z_]\w*?)\d+", part)
        if match and match.group(1) in args:
            return False
    return True


def ordered_candidates(project: Project, files: dict[str, bytes], seed: int) -> list[Mutation]:
    """All mutants, shuffled per operator with a seeded RNG, then interleaved so that every
    bug family gets its turn."""
    rng = random.Random(f"{seed}:{project.slug}")
    by_op: dict[str, list[Mutation]] = defaultdict(list)
    for path in project.mutate:
        for m in mutations(path, files[path].decode()):
            by_op[m.operator].append(m)
    queues = []
    for op in sorted(by_op):
        queue = sorted(by_op[op], key=lambda m: m.key)
        rng.shuffle(queue)
        queues.append(queue)
    out: list[Mutation] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop(0))
    return out


def screen(project: Project, files: dict[str, bytes], config: PipelineConfig,
           log: Log) -> list[Candidate]:
    """Evaluate mutants until `tasks_per_project` qualify: ≥1 F2P, ≥1 P2P in the same files,
    at most `max_fail_to_pass` F2P, one task per function."""
    with tempfile.TemporaryDirectory(prefix=f"envhub-swe-{project.name}-") as tmp:
        root = Path(tmp)
        write_tree(root, files)
        code, base_log = run_tests(root, project.tests, project.pythonpath)
        arguments = test_arguments(root, project.tests)
        passing = {t for t, s in base_log.statuses.items()
                   if s == PASSED and stable_id(t, arguments)}
        if code != 0 or not passing:
            raise PipelineError(f"{project.slug}: its tests do not pass unmodified (exit {code}); "
                                "choose other test files in projects.toml")
        chosen: list[Candidate] = []
        used: set[tuple[str, str]] = set()
        evaluated = 0
        for m in ordered_candidates(project, files, config.seed):
            if len(chosen) >= config.tasks_per_project or evaluated >= config.max_candidates:
                break
            if (m.path, m.function) in used:
                continue
            evaluated += 1
            (root / m.path).write_text(m.source)
            try:
                _, mutant_log = run_tests(root, project.tests, project.pythonpath)
            finally:
                (root / m.path).write_bytes(files[m.path])
            f2p = sorted(t for t in passing if mutant_log.status(t) != PASSED)
            if not f2p or len(f2p) > config.max_fail_to_pass or not mutant_log.has_summary:
                continue
            hidden = sorted({t.split("::")[0] for t in f2p})
            if len(hidden) > config.max_test_files:
                continue
            p2p = sorted(t for t in passing if t.split("::")[0] in hidden
                         and mutant_log.status(t) == PASSED)
            if not p2p:
                continue
            used.add((m.path, m.function))
            chosen.append(Candidate(m, f2p, p2p, hidden))
            log(f"  {project.slug}: {m.function} ({m.operator}: {m.detail}) "
                f"F2P={len(f2p)} P2P={len(p2p)}")
        log(f"{project.slug}: {len(chosen)} tasks from {evaluated} evaluated mutants")
        return chosen


def base_commit(archive: bytes, source_patch: str, remove: list[str], message: str) -> str:
    """Run the same setup_repo.sh the sandboxes run, here, to learn the base commit id."""
    with tempfile.TemporaryDirectory(prefix="envhub-swe-commit-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        (src / "source.tar.gz").write_bytes(archive)
        (src / "source.patch").write_text(source_patch)
        (src / "remove.txt").write_text("\n".join(remove) + "\n")
        (src / "message.txt").write_text(message)
        result = subprocess.run(["sh", str(SCRIPTS / "setup_repo.sh"), str(Path(tmp) / "repo"),
                                 str(src)], capture_output=True, text=True, timeout=120,
                                check=False)
        if result.returncode != 0:
            raise PipelineError(f"setup_repo.sh failed: {result.stderr.strip()[-500:]}")
        return result.stdout.strip().splitlines()[-1]


def task_row(project: Project, files: dict[str, bytes], archive: bytes, c: Candidate,
             statement: str, instance_id: str) -> dict[str, Any]:
    m = c.mutation
    original, buggy = files[m.path].decode(), m.source
    source_patch = file_diff(m.path, original, buggy)
    test_cmd = BASE_TEST_CMD
    if project.pythonpath:
        test_cmd = f"PYTHONPATH={project.pythonpath}${{PYTHONPATH:+:$PYTHONPATH}} {test_cmd}"
    row = SWETask(
        instance_id=instance_id, repo=project.repo, problem_statement=statement,
        base_commit=base_commit(archive, source_patch, c.hidden,
                                f"{project.repo} {project.version}\n"),
        patch=file_diff(m.path, buggy, original),
        test_patch=new_files_patch({p: files[p] for p in c.hidden}),
        FAIL_TO_PASS=c.f2p, PASS_TO_PASS=c.p2p, version=project.version, created_at=CREATED_AT,
        test_cmd=test_cmd, test_files=c.hidden, test_env=dict(sorted(RUN_ENV.items())),
        repo_dir=REPO_DIR, timeout=120, test_timeout=20,
        source_archive=f"snapshots/{project.slug}.tar.gz", source_patch=source_patch,
        source_remove=c.hidden,
        metadata={"bug_family": m.operator, "mutation": m.detail, "function": m.function,
                  "file": m.path, "line": m.line, "sdist_sha256": project.sha256,
                  "pythonpath": project.pythonpath},
    )
    return row.model_dump(mode="json")


def build_project(project: Project, config: PipelineConfig, cache: Path,
                  log: Log) -> tuple[bytes, list[dict[str, Any]]]:
    sdist = fetch_sdist(project, cache)
    files = snapshot_files(project, sdist)
    archive = deterministic_targz(files)
    rows = []
    rng = random.Random(f"{config.seed}:{project.slug}:statements")
    seen: set[str] = set()
    with tempfile.TemporaryDirectory(prefix=f"envhub-swe-{project.name}-") as tmp:
        root = Path(tmp)
        write_tree(root, files)
        for c in screen(project, files, config, log):
            (root / c.mutation.path).write_text(c.mutation.source)
            try:
                excerpts = failure_excerpts(root, c.f2p, project.pythonpath)
            finally:
                (root / c.mutation.path).write_bytes(files[c.mutation.path])
            statement = problem_statement(c.mutation, project.name, c.f2p, excerpts, rng)
            instance_id = f"{project.slug}__{c.mutation.function}__{c.mutation.operator}"
            if instance_id in seen:
                instance_id += f"__L{c.mutation.line}"
            seen.add(instance_id)
            rows.append(task_row(project, files, archive, c, statement, instance_id))
    return archive, rows


def write_task_set(out: Path, archives: dict[str, bytes], rows: list[dict[str, Any]]) -> None:
    """Replace `out/tasks.jsonl` and `out/snapshots/` (written aside first, then renamed, so a
    failed build never leaves a half-written task set)."""
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out.parent))
    (staging / "snapshots").mkdir()
    for name, data in sorted(archives.items()):
        (staging / "snapshots" / name).write_bytes(data)
    lines = [json.dumps(r, sort_keys=True, ensure_ascii=False) for r in
             sorted(rows, key=lambda r: r["instance_id"])]
    (staging / "tasks.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if out.exists():
        old = out.with_name(out.name + ".old")
        out.rename(old)
        staging.rename(out)
        subprocess.run(["rm", "-rf", str(old)], check=False)
    else:
        staging.rename(out)
