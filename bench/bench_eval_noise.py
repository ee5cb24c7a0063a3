"""How noisy is the held-out evaluation's before -> after difference? (issue 12)

`envhub train` evaluates the held-out tasks before the first step and after the last; the
difference is what training taught beyond its own problems, a few hundredths in a 30-step CPU
run. Each evaluation samples (avg@n), so it carries sampling noise; the question is how much of
it reaches the difference. Two ways to draw the samples:

- fresh: every evaluation draws new random numbers (what `envhub train` did before): the
  difference carries both evaluations' noise;
- common (the default now): every evaluation of a run asks the engine for the same sampling
  seeds per task, sample and turn (`ToolCallingAgent(seed=...)`), so both evaluations draw the
  same uniforms and a token differs only where the weights moved its probabilities across the
  draw.

This runs the held-out evaluation of arith as `envhub train` does (64 tasks x --eval-samples) with
the starting model A and a trained model B (`--trained DIR`, an `OUT/weights/vN` folder of
`envhub train`; default: 10 steps of `envhub train arith` first), each with seeds 1..R, and
prints side by side: each model's mean and spread over the seeds (one evaluation's noise, the
same either way), the difference B - A with common random numbers (B and A with the same seed)
and with fresh ones (B with seed s, A with seed s+1), their spread, and the ratio. It also
evaluates A twice with the same seed: what the engine's batch numerics leave.

    .venv/bin/python bench/bench_eval_noise.py [--trained DIR] [--base DIR] [--repeats R]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


async def _evaluations(model: str | None, seeds: list[int], scratch: Path,
                       samples: int | None) -> list[float]:
    """The held-out solved rate of `model` once per seed (in order), through a gateway of its
    own, as `envhub train`'s evaluation runs it."""
    from envhub.envs.agents.tool_calling import ToolCallingAgent
    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.server import run_in_thread
    from envhub.orchestrator.groups.setup import new_run_id
    from envhub.orchestrator.groups.stream import GroupRunner
    from envhub.orchestrator.train import TrainLoopConfig, load_training_envs
    from envhub.orchestrator.training.evaluate import evaluate

    cfg = TrainLoopConfig(out=scratch, **({} if samples is None else {"eval_samples": samples}))
    envs = load_training_envs(cfg)
    admin = "envhub-admin-" + secrets.token_urlsafe(16)
    db = scratch / f"pool-{secrets.token_hex(4)}.db"
    gw = run_in_thread(GatewayConfig(port=0, db=f"sqlite:///{db}", admin_key=admin,
                                     model=model))
    try:
        runner = await GroupRunner.open([e.ref for e in envs], gateway=gw.url, admin_key=admin,
                                        agent=ToolCallingAgent(), run_id=new_run_id())
        try:
            rates = []
            for seed in seeds:
                t0 = time.perf_counter()
                row = await evaluate(runner, envs, 0, cfg.concurrency, None, cfg.eval_samples,
                                     seed=seed)
                rates.append(row["eval/resolved_rate"])
                print(f"  {model or 'bundled model'}  seed {seed}: resolved "
                      f"{rates[-1]:.4f}  ({int(row['eval/rollouts'])} rollouts, "
                      f"{time.perf_counter() - t0:.0f} s)", flush=True)
            return rates
        finally:
            await runner.aclose()
    finally:
        gw.close()


def _train(out: Path, steps: int) -> Path:
    print(f"training {steps} steps of `envhub train arith` into {out} ...", flush=True)
    subprocess.run([sys.executable, "-m", "envhub", "train", "arith", "--steps", str(steps),
                    "--seed", "0", "--eval-every", "0", "--out", str(out)], check=True,
                   cwd=ROOT, stdout=subprocess.DEVNULL)
    return max((out / "weights").iterdir())


def _spread(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trained", type=Path, help="model B: an OUT/weights/vN folder "
                    "(default: train 10 steps first)")
    ap.add_argument("--base", default=None, help="model A (default: the bundled model)")
    ap.add_argument("--repeats", type=int, default=4, help="evaluation seeds per model")
    ap.add_argument("--train-steps", type=int, default=10)
    ap.add_argument("--eval-samples", type=int, default=None,
                    help="samples per held-out task (default: envhub train's)")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be at least 2: the fresh pairs need another seed")
    seeds = list(range(1, args.repeats + 1))
    with tempfile.TemporaryDirectory(prefix="envhub-evalnoise-") as tmp:
        scratch = Path(tmp)
        trained = args.trained or _train(scratch / "train", args.train_steps)
        a = asyncio.run(_evaluations(args.base, seeds + [seeds[0]], scratch, args.eval_samples))
        a, again = a[:-1], a[-1]
        b = asyncio.run(_evaluations(str(trained), seeds, scratch, args.eval_samples))
    n = len(seeds)
    common = [b[i] - a[i] for i in range(n)]
    fresh = [b[i] - a[(i + 1) % n] for i in range(n)]
    print(f"\nheld-out solved rate, arith, {n} seeds; A = {args.base or 'bundled model'}, "
          f"B = {trained}")
    print(f"{'':34}{'mean':>9}{'spread':>9}")
    print(f"{'A, one evaluation':34}{statistics.fmean(a):9.4f}{_spread(a):9.4f}")
    print(f"{'B, one evaluation':34}{statistics.fmean(b):9.4f}{_spread(b):9.4f}")
    print(f"{'B - A, common random numbers':34}{statistics.fmean(common):+9.4f}"
          f"{_spread(common):9.4f}")
    print(f"{'B - A, fresh random numbers':34}{statistics.fmean(fresh):+9.4f}"
          f"{_spread(fresh):9.4f}")
    ratio = _spread(common) / _spread(fresh) if _spread(fresh) else float("nan")
    print(f"spread of the difference, common / fresh: {ratio:.2f}")
    print(f"A evaluated again with seed {seeds[0]}: {again:.4f} (first: {a[0]:.4f}; "
          "the engine's batch numerics)")


if __name__ == "__main__":
    main()
