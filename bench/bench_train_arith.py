"""`envhub train arith` over several seeds (issue 12): does the default command learn?

Runs the real command line — embedded gateway + engine, built-in agent rollouts, the
asynchronous trainer loop, weight sync through POST /admin/weights — with no other flags than
`--steps`, `--seed` and `--out` (the demo runs on its defaults), then reads each run's
OUT/metrics.jsonl and prints, side by side, per seed: the mean reward and solved rate of the
first and the last `--window` steps, the held-out evaluation's solved rate (on tasks never
trained on) before the first step and after the last, and over the evaluations in the first
and last windows; then the margins' mean and spread over the seeds, and the solved rate of the
groups trained on in each window on the same tasks (the task mix of a window is noise: a third
of arith's problems, the word family, are never solved by the bundled model) and per family.

    .venv/bin/python bench/bench_train_arith.py [--seeds 0 1 2] [--steps 30] [--window 10]
        [--jobs J] [--load N] [--baseline K] [-- more envhub train options]
    .venv/bin/python bench/bench_train_arith.py --runs DIR [--baseline K]   # runs already made

arith (0.3.0) trains on 160 tasks, 10 steps' worth at 16 a step, so the first and the last
window train on the same problems and their margin is learning plus sampling noise (±0.015).
Where the windows draw different tasks (a larger task set, other `--groups`), which tasks a
window drew moves its mean by about as much as 20 steps of learning (±0.03 with 0.2's 448 tasks
at 16 a step); `--baseline K` takes that out: the initial policy is run K times on every task of
both windows (`envhub run arith`, into DIR/seed-S/baseline, once), and each window's solved rate
is reported over the initial policy's on the same tasks.

`--load N` runs N busy processes (one core each) beside the runs, `--jobs J` runs J seeds at
once (each loads the others): "the same with another job loading the machine". The load
average seen during the runs is printed. Each seed's run lands in DIR/seed-S (default: a
fresh folder under runs/).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BURN = "import itertools\nfor i in itertools.count():\n    (i * i) % 7\n"


def read_rows(folder: Path) -> tuple[list[dict], list[dict]]:
    """The step rows and the held-out evaluation rows (`"phase": "eval"`) of a run."""
    path = folder / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return ([r for r in rows if r.get("phase", "train") == "train"],
            [r for r in rows if r.get("phase") == "eval"])


def mean_of(rows: list[dict], key: str) -> float:
    return statistics.fmean(r[key] for r in rows)


def solved_by_task(folder: Path, rows: list[dict], window: int
                   ) -> dict[str, dict[str, list[int]]]:
    """Per task: [rollouts, solved] among the groups trained on in the first and in the last
    `window` steps (each step row names its groups), read from the run's pool."""
    from envhub.trainer.source import StoreSource

    ends = {"first": rows[:window], "last": rows[-window:]}
    tally: dict[str, dict[str, list[int]]] = {}
    with StoreSource(f"sqlite:///{folder / 'pool.db'}") as pool:
        by_id = {g.group_id: g for g in pool.list_groups()}
        for end, chosen in ends.items():
            for gid in (g for r in chosen for g in r.get("groups", [])):
                for t in pool.fetch([s.id for s in by_id[gid].sessions]):
                    solved = any(r.kind == "outcome" and r.value >= 1.0 for r in t.rewards)
                    n = tally.setdefault(t.session.task_id or "", {}).setdefault(end, [0, 0])
                    n[0] += 1
                    n[1] += solved
    return tally


def by_family(tally: dict[str, dict[str, list[int]]]) -> dict[str, tuple[float, float]]:
    """Solved rate per arith problem family, first window -> last."""
    from envhub.envs.loader import load_env

    family = {t.id: t.data.get("family", "") for t in load_env("arith").env.load_tasks()}
    sums: dict[str, dict[str, list[int]]] = {}
    for task, ends in tally.items():
        for end, (n, solved) in ends.items():
            acc = sums.setdefault(family.get(task, ""), {}).setdefault(end, [0, 0])
            acc[0] += n
            acc[1] += solved
    return {f: (v["first"][1] / v["first"][0], v["last"][1] / v["last"][0])
            for f, v in sorted(sums.items()) if "first" in v and "last" in v}


def paired(tally: dict[str, dict[str, list[int]]]) -> tuple[int, float, float]:
    """Over the tasks trained on in both windows: how many, and the mean of their solved rates
    in the first and in the last window (the task mix cancels out)."""
    both = [v for v in tally.values() if "first" in v and "last" in v]
    if not both:
        return 0, float("nan"), float("nan")
    return (len(both), statistics.fmean(v["first"][1] / v["first"][0] for v in both),
            statistics.fmean(v["last"][1] / v["last"][0] for v in both))


def baseline_rates(folder: Path, tasks: list[str], k: int, model: str | None) -> dict[str, float]:
    """Per task: the solved rate of the initial policy (`envhub run arith` with the model the
    run started from, k samples a task), run once into folder/baseline and read back after."""
    out = folder / "baseline"
    if not (out / "summary.json").is_file():
        cmd = [sys.executable, "-m", "envhub", "run", "arith", "-k", str(k), "-c", "16",
               "--out", str(out), *(["--model", model] if model else [])]
        for task in tasks:
            cmd += ["-t", task]
        print(f"{folder.name}: the initial policy on the windows' {len(tasks)} tasks, k={k}",
              flush=True)
        with open(folder / "baseline.log", "w") as log:
            subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=ROOT)
    solved: dict[str, list[float]] = {}
    for path in (out / "rollouts").glob("*.json"):
        row = json.loads(path.read_text())
        if row["outcome"] is not None:  # None: an env_failure, no verdict
            solved.setdefault(row["task_id"], []).append(float(row["outcome"] >= 1.0))
    return {task: statistics.fmean(v) for task, v in solved.items()}


def lift(tally: dict[str, dict[str, list[int]]], base: dict[str, float], end: str) -> float:
    """Solved rate of a window's trained rollouts minus the initial policy's rate on the same
    tasks (rollout-weighted): what the window gained, with its task draw taken out."""
    n = sum(v[end][0] for t, v in tally.items() if end in v and t in base)
    return sum(v[end][1] - v[end][0] * base[t] for t, v in tally.items()
               if end in v and t in base) / n


def eval_ends(evals: list[dict], steps: int, window: int) -> tuple[float, float, float, float]:
    """Held-out eval (solved rate): before the first step, after the last, and the means of
    the evaluations made within the first `window` steps (before step `window`) and the
    last."""
    first = [e["eval/resolved_rate"] for e in evals if e["after_step"] < window]
    last = [e["eval/resolved_rate"] for e in evals if e["after_step"] >= steps - window - 1]
    nan = float("nan")
    return (evals[0]["eval/resolved_rate"], evals[-1]["eval/resolved_rate"],
            statistics.fmean(first) if first else nan, statistics.fmean(last) if last else nan)


def summarise(runs: dict[int, tuple[list[dict], list[dict]]], window: int,
              folders: dict[int, Path] | None = None, baseline: int = 0,
              model: str | None = None) -> None:
    print(f"\n{'seed':>4} {'steps':>5} {'first':>6} {'last':>6} {'margin':>7} "
          f"{'solved':>13}   {'eval 0':>6} {'eval N':>6} {'eval first':>10} {'eval last':>9}"
          f" {'margin':>7}   {'IS masked':>9} {'s/step':>6}")
    margins, eval_margins = [], []
    for seed, (rows, evals) in sorted(runs.items()):
        if len(rows) < 2 * window:
            print(f"{seed:>4} {len(rows):>5}  (fewer than {2 * window} steps: skipped)")
            continue
        first, last = rows[:window], rows[-window:]
        margin = mean_of(last, "reward_mean") - mean_of(first, "reward_mean")
        margins.append(margin)
        masked = statistics.fmean(r.get("trainer/is/masked_fraction", 0.0) for r in rows)
        per_step = (rows[-1]["wall_s"] - rows[0]["wall_s"]) / (len(rows) - 1)  # wall_s: since start
        cols = "  (no held-out evaluation)"
        if evals:
            e0, en, ef, el = eval_ends(evals, len(rows), window)
            if el == el and ef == ef:  # both ends evaluated (not NaN)
                eval_margins.append(el - ef)
            cols = f"   {e0:>6.3f} {en:>6.3f} {ef:>10.3f} {el:>9.3f} {el - ef:>+7.3f}"
        print(f"{seed:>4} {len(rows):>5} {mean_of(first, 'reward_mean'):>6.3f} "
              f"{mean_of(last, 'reward_mean'):>6.3f} {margin:>+7.3f} "
              f"{mean_of(first, 'resolved_rate'):>6.3f}->{mean_of(last, 'resolved_rate'):.3f}"
              f"{cols}   {masked:>9.4f} {per_step:>6.1f}")
    for name, values in (("mean reward", margins), ("held-out eval", eval_margins)):
        if values:
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            print(f"\nmargin of the {name} (last {window} steps - first {window}) over "
                  f"{len(values)} seeds: {statistics.fmean(values):+.3f} ± {spread:.3f} "
                  f"(sample std), min {min(values):+.3f}, max {max(values):+.3f}")
    if folders:
        print(f"\nsolved rate, first {window} steps -> last {window}: on the same tasks "
              "(those trained on in both windows, mean of per-task rates), and by family:")
        gains, lifts = [], []
        for seed, folder in sorted(folders.items()):
            rows = runs[seed][0]
            if len(rows) >= 2 * window and (folder / "pool.db").is_file():
                tally = solved_by_task(folder, rows, window)
                n, a, b = paired(tally)
                if n:
                    gains.append(b - a)
                same = (f"same {n} tasks {a:.3f} -> {b:.3f} ({b - a:+.3f})" if n
                        else "no task trained on in both windows")
                print(f"  seed {seed}: {same}; " + ", ".join(
                    f"{f} {x:.2f} -> {y:.2f}" for f, (x, y) in by_family(tally).items()))
                if baseline:
                    base = baseline_rates(folder, sorted(tally), baseline, model)
                    first, last = lift(tally, base, "first"), lift(tally, base, "last")
                    lifts.append(last - first)
                    print(f"          over the initial policy on the same tasks: first window "
                          f"{first:+.3f}, last {last:+.3f}, margin {last - first:+.3f}")
        if gains:
            print(f"  paired gain over {len(gains)} seeds: {statistics.fmean(gains):+.3f}, "
                  f"min {min(gains):+.3f}, max {max(gains):+.3f}")
        if lifts:
            print(f"  margin over the initial policy ({len(lifts)} seeds): "
                  f"{statistics.fmean(lifts):+.3f}, min {min(lifts):+.3f}, max {max(lifts):+.3f}")
    print("\nreward per step (mean of the step's rollouts), and held-out solved rate "
          "(after step):")
    for seed, (rows, evals) in sorted(runs.items()):
        print(f"  seed {seed}: " + " ".join(f"{r['reward_mean']:.2f}" for r in rows))
        print("  " + " " * len(f"seed {seed}:") + " ".join(
            f"{e['after_step']}:{e['eval/resolved_rate']:.2f}" for e in evals))


class LoadWatch:
    """`n` busy processes (one core each) for the duration, and the load average seen."""

    def __init__(self, n: int) -> None:
        self.procs = [subprocess.Popen([sys.executable, "-c", BURN]) for _ in range(n)]
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(10.0):
            self.samples.append(os.getloadavg()[0])

    def close(self) -> str:
        self._stop.set()
        for p in self.procs:
            p.kill()
            p.wait()
        if not self.samples:
            return "load average: not sampled"
        return (f"load average (1 min, every 10 s) during the runs: mean "
                f"{statistics.fmean(self.samples):.1f}, min {min(self.samples):.1f}, max "
                f"{max(self.samples):.1f}; {len(self.procs)} busy process(es) beside them")


def run_seed(seed: int, out: Path, args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    folder = out / f"seed-{seed}"
    started = time.monotonic()
    cmd = [sys.executable, "-m", "envhub", "train", "arith", "--steps", str(args.steps),
           "--seed", str(seed), "--out", str(folder), *args.extra]
    print(f"seed {seed}: {' '.join(cmd[2:])}", flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=True, cwd=ROOT)
    rows = read_rows(folder)
    print(f"seed {seed}: {len(rows[0])} steps in {time.monotonic() - started:.0f}s "
          f"(log: {folder / 'train.log'})", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--window", type=int, default=10, help="steps averaged at each end")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run at once")
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the runs")
    ap.add_argument("--runs", type=Path, help="folder of seed-S runs: summarise, run nothing")
    ap.add_argument("--out", type=Path, help="where the runs go (default runs/bench-train-*)")
    ap.add_argument("--baseline", type=int, default=0, metavar="K",
                    help="also run the initial policy K times on each task of the two windows "
                    "and report each window's solved rate over it (the task draw taken out)")
    ap.add_argument("extra", nargs="*", help="more `envhub train` options, after --")
    args = ap.parse_args()
    # the model the runs start from, in either form `envhub train` takes (--model DIR, --model=DIR)
    train_opts = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    train_opts.add_argument("--model")
    model = train_opts.parse_known_args(args.extra)[0].model
    if args.runs is not None:
        folders = {int(p.name.split("-", 1)[1]): p for p in sorted(args.runs.glob("seed-*"))
                   if (p / "metrics.jsonl").is_file()}
        if not folders:
            ap.error(f"--runs {args.runs}: no seed-*/metrics.jsonl inside")
        summarise({s: read_rows(p) for s, p in folders.items()}, args.window, folders,
                  args.baseline, model)
        return
    out = args.out or ROOT / "runs" / time.strftime("bench-train-%Y%m%d-%H%M%S")
    watch = LoadWatch(args.load)
    try:
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            results = dict(zip(args.seeds, pool.map(lambda s: run_seed(s, out, args),
                                                     args.seeds), strict=True))
    finally:
        print(watch.close())
    summarise(results, args.window, {seed: out / f"seed-{seed}" for seed in results},
              args.baseline, model)


if __name__ == "__main__":
    main()
