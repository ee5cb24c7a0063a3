"""SWE grading costs, measured side by side in one run.

    python bench/bench_swe_grading.py                # every task, local + docker when present
    python bench/bench_swe_grading.py --limit 6 --kinds local

Prints, per task: grading time of the gold patch (fresh sandbox + repo + tests) for each
sandbox kind — `docker` rebuilds the repository in a base-image container, `docker-image`
starts from the task's prebuilt image as the swe-task environment does — and, for docker, the
per-task image build time cold (image removed first) and cached, and the disk the task image
adds on top of the base image (its own layers).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

from envhub.envs.manifest import SandboxSpec
from envhub.envs.swe.construct.validate import pristine_opener
from envhub.envs.swe.grading import grade
from envhub.envs.swe.task import SWETask, load_swe_tasks

DATA = Path(__file__).resolve().parents[1] / "envs" / "builtin" / "swe_task" / "data"


def image_opener(task: SWETask):  # noqa: ANN201 - an async sandbox factory
    from envhub.envs.sandbox import open_sandbox
    from envhub.envs.swe.task_image import task_image

    tag = task_image(task, DATA).tag

    async def open_pristine():  # noqa: ANN202
        return await open_sandbox("docker", SandboxSpec(image=tag), run_id="bench-swe")
    return open_pristine


def grading_seconds(task: SWETask, kind: str) -> tuple[float, bool]:
    if kind == "docker-image":
        opener = image_opener(task)
    else:
        opener = pristine_opener(task, DATA, kind, SandboxSpec(), "bench-swe")
    start = time.monotonic()
    verdict = asyncio.run(grade(task, task.patch, opener))
    return time.monotonic() - start, verdict.resolved and verdict.env_failure is None


def image_costs(task: SWETask) -> tuple[float, float, int]:
    """(cold build s, cached build s, bytes added on top of the base image)."""
    from envhub.envs.images import ensure_base_image
    from envhub.envs.sandbox.engine import docker_client
    from envhub.envs.swe.task_image import task_image

    client = docker_client()
    first = task_image(task, DATA)  # make sure the tag is known, then remove it for a cold build
    client.images.remove(first.tag, force=True)
    cold = task_image(task, DATA)
    cached = task_image(task, DATA)
    assert not cold.cached and cached.cached
    base = client.images.get(ensure_base_image().tag)
    return cold.seconds, cached.seconds, cold.size_bytes - int(base.attrs["Size"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--limit", type=int, default=0, help="first N tasks (0: all)")
    parser.add_argument("--kinds", default="auto",
                        help="comma list of local,docker,docker-image; auto: all available")
    args = parser.parse_args()
    tasks = load_swe_tasks(DATA / "tasks.jsonl")
    if args.limit:
        tasks = tasks[: args.limit]
    from envhub.envs.sandbox.engine import docker_reachable

    kinds = (["local", "docker", "docker-image"] if args.kinds == "auto"
             else args.kinds.split(","))
    if not docker_reachable():
        print("docker not reachable: measuring local only", file=sys.stderr)
        kinds = [k for k in kinds if not k.startswith("docker")]
    header = f"{'task':58} " + " ".join(f"{'grade ' + k + ' s':>18}" for k in kinds)
    if "docker" in kinds:
        header += f" {'img cold s':>10} {'img cached s':>12} {'img +MB':>8}"
    print(header)
    columns: dict[str, list[float]] = {k: [] for k in [*kinds, "cold", "cached", "mb"]}
    for task in tasks:
        row = f"{task.instance_id[:58]:58} "
        for kind in kinds:
            seconds, ok = grading_seconds(task, kind)
            columns[kind].append(seconds)
            row += f"{seconds:17.2f}{' ' if ok else '!'} "
        if "docker" in kinds:
            cold, cached, added = image_costs(task)
            columns["cold"].append(cold)
            columns["cached"].append(cached)
            columns["mb"].append(added / 1e6)
            row += f"{cold:10.2f} {cached:12.3f} {added / 1e6:8.2f}"
        print(row, flush=True)
    summary = "median".ljust(59) + " ".join(
        f"{statistics.median(columns[k]):17.2f} " for k in kinds)
    if "docker" in kinds:
        summary += (f"{statistics.median(columns['cold']):10.2f} "
                    f"{statistics.median(columns['cached']):12.3f} "
                    f"{statistics.median(columns['mb']):8.2f}")
    print(summary)
    print("('!' marks a gold patch that did not resolve: a broken task or sandbox)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
