"""Rebuild the offline SWE task set of the built-in `swe-task` environment.

    python scripts/build_swe_tasks.py                 # build + validate (local sandbox)
    python scripts/build_swe_tasks.py --check         # rebuild to a temp dir, compare bytes
    python scripts/build_swe_tasks.py --sandbox docker --validate-only

Inputs are pinned in envs/swe/construct/projects.toml (versions + sha256 of the sdists,
fetched with `pip download`); the same inputs give byte-identical task files.
Exit codes: 0 ok, 1 validation or comparison failed, 2 bad configuration/input.
"""

from __future__ import annotations

import argparse
import filecmp
import sys
import tempfile
from pathlib import Path

from envhub.envs.swe.construct.build import PipelineError, build_project, write_task_set
from envhub.envs.swe.construct.config import DEFAULT_CONFIG, load_config
from envhub.envs.swe.construct.sdist import SdistError
from envhub.envs.swe.construct.validate import validate_all
from envhub.envs.swe.task import load_swe_tasks

PACKAGE = Path(__file__).resolve().parents[1] / "envs" / "builtin" / "swe_task"
MIN_TASKS, MIN_PROJECTS = 24, 4


def build(config_path: Path, out: Path, cache: Path) -> int:
    config = load_config(config_path)
    archives: dict[str, bytes] = {}
    rows = []
    for project in config.project:
        archive, project_rows = build_project(project, config, cache, print)
        archives[f"{project.slug}.tar.gz"] = archive
        rows += project_rows
    projects = {r["repo"] for r in rows}
    if len(rows) < MIN_TASKS or len(projects) < MIN_PROJECTS:
        raise PipelineError(f"only {len(rows)} tasks from {len(projects)} projects; need "
                            f"{MIN_TASKS} from {MIN_PROJECTS}: raise tasks_per_project or "
                            "max_candidates, or add a project")
    write_task_set(out, archives, rows)
    print(f"wrote {len(rows)} tasks from {len(projects)} projects to {out}")
    return len(rows)


def compare(a: Path, b: Path) -> list[str]:
    names = sorted({p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()} |
                   {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()})
    return [n for n in names if not ((a / n).is_file() and (b / n).is_file()
                                     and filecmp.cmp(a / n, b / n, shallow=False))]


def _explain_difference(shipped: Path, fresh: Path) -> None:
    """Which tasks and fields differ (the rebuild runs real test suites: say what moved)."""
    import json

    old = {r["instance_id"]: r for r in map(json.loads, shipped.read_text().splitlines())}
    new = {r["instance_id"]: r for r in map(json.loads, fresh.read_text().splitlines())}
    for iid in sorted(old.keys() | new.keys()):
        if iid not in old or iid not in new:
            print(f"  {iid}: only in {'the shipped set' if iid in old else 'the rebuild'}")
            continue
        fields = [k for k in old[iid] if old[iid][k] != new[iid].get(k)]
        if fields:
            print(f"  {iid}: {', '.join(fields)} differ")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--out", type=Path, default=PACKAGE / "data")
    parser.add_argument("--cache", type=Path,
                        default=Path.home() / ".cache" / "envhub" / "sdists")
    parser.add_argument("--sandbox", default="local", choices=["local", "docker", "auto"])
    parser.add_argument("--check", action="store_true",
                        help="rebuild into a temp dir and compare with --out byte for byte")
    parser.add_argument("--no-validate", action="store_true")
    parser.add_argument("--validate-only", action="store_true")
    args = parser.parse_args(argv)
    try:
        if args.check:
            with tempfile.TemporaryDirectory() as tmp:
                fresh = Path(tmp) / "data"
                build(args.config, fresh, args.cache)
                differ = compare(args.out, fresh)
                print("identical" if not differ else f"DIFFERENT: {', '.join(differ)}")
                if "tasks.jsonl" in differ:
                    _explain_difference(args.out / "tasks.jsonl", fresh / "tasks.jsonl")
                return 1 if differ else 0
        if not args.validate_only:
            build(args.config, args.out, args.cache)
        if args.no_validate:
            return 0
        tasks = load_swe_tasks(args.out / "tasks.jsonl")
        results = validate_all(tasks, args.out, args.sandbox)
        bad = [v.instance_id for v in results if not v.ok]
        print(f"validated {len(results) - len(bad)}/{len(results)} tasks on '{args.sandbox}'")
        return 1 if bad else 0
    except (PipelineError, SdistError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
