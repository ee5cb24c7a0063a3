"""The trainer's side of `envhub train`: per step, take groups (windowed FIFO over the
producer's generation order), train, push every K steps, write the step's row; held-out
evaluation before the first step, every E steps and after the last; a checkpoint after every
push (or every `--checkpoint-every` steps) and after the last step (resume.py).

Ctrl-C (SIGINT) does not cut a step in half: the loop stops at the next step boundary (or
while it waits for groups), writes a checkpoint and returns; a second Ctrl-C stops at once."""

from __future__ import annotations

import random
import signal
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envhub.orchestrator.groups.results import RolloutRecord
from envhub.orchestrator.training.evaluate import evaluate
from envhub.orchestrator.training.metrics import step_metrics
from envhub.orchestrator.training.resume import checkpoint_folder, prune_checkpoints
from envhub.orchestrator.training.source import LaunchOrderSource, wait_state
from envhub.sdk import failpoints
from envhub.trainer.filters import oldest_version
from envhub.trainer.source import Group

if TYPE_CHECKING:
    from envhub.orchestrator.groups.task_metrics import TaskMetrics
    from envhub.orchestrator.training.config import TrainLoopConfig
    from envhub.orchestrator.training.ledger import GroupLedger
    from envhub.orchestrator.training.producer import Producer
    from envhub.orchestrator.training.tasks import EnvTasks
    from envhub.orchestrator.training.trackers import Trackers
    from envhub.trainer.trainer import Trainer
    from envhub.trainer.window import GroupWindow

POLL_S = 2.0  # longest wait between two looks at the window (a safety net: completions notify)
PUSH_ATTEMPTS = 8  # a weight push the gateway answers 503/429 is retried (about 2.5 min in all)


SAMPLES_PER_STEP = 4  # rollouts of each step shown to the trackers
PROMPT_TAIL, COMPLETION = 400, 2000  # characters of each kept


class Interrupted(Exception):
    """Ctrl-C while the loop waited for groups."""


@dataclass
class LoopStart:
    """Where the loop begins: step 0, or a resumed run's checkpoint."""

    step: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)  # metrics rows so far
    samples: list[dict[str, Any]] = field(default_factory=list)  # samples.jsonl's rows so far
    wall_s: float = 0.0  # the run's wall time before this process


class Loop:
    def __init__(self, cfg: TrainLoopConfig, trainer: Trainer, producer: Producer,
                 source: LaunchOrderSource, window: GroupWindow, envs: list[EnvTasks], *,
                 push_url: str, admin_key: str, log: Callable[[str], Any],
                 on_wait: Callable[[Any], None] | None = None, eval_agent: Any = None,
                 metrics: TaskMetrics | None = None, dtypes: dict[str, str] | None = None,
                 start: LoopStart | None = None,
                 on_row: Callable[[dict[str, Any]], None] | None = None,
                 trackers: Trackers | None = None, tokenizer: Any = None) -> None:
        self.cfg, self.trainer, self.producer = cfg, trainer, producer
        self.ledger: GroupLedger = producer.ledger
        self.source, self.window, self.envs = source, window, envs
        self.push_url, self.admin_key, self.log = push_url, admin_key, log
        self.on_wait, self.eval_agent, self.metrics = on_wait, eval_agent, metrics
        self.on_row = on_row  # each metrics row as it is written (the live console)
        self.trackers, self.tokenizer = trackers, tokenizer  # --log-to; samples decoded
        self.dtypes = dtypes or {}  # train_dtype, rollout_dtype: in every step's row
        start = start or LoopStart()
        self.start_step = start.step
        self.rows: list[dict[str, Any]] = list(start.rows)
        self._started = time.perf_counter() - start.wall_s
        self.interrupted = False  # Ctrl-C stopped the run (a checkpoint holds where)
        self._stop = threading.Event()
        self._steps_done = start.step

    def run(self) -> list[dict[str, Any]]:
        previous = self._on_sigint()
        try:
            self._run()
        except Interrupted:
            pass
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if self._stop.is_set() and self._steps_done < self.cfg.steps:
            self.interrupted = True
            self.log(f"interrupted after step {self._steps_done - 1}: writing a checkpoint")
            self.checkpoint(self._steps_done)
        return self.rows

    def _on_sigint(self) -> Any:
        """The first Ctrl-C asks the loop to stop at the next step boundary; the handler
        then gives way to Python's own (a second Ctrl-C raises KeyboardInterrupt)."""
        if threading.current_thread() is not threading.main_thread():
            return None

        def stop(signum: int, frame: Any) -> None:
            self._stop.set()
            self.ledger.wake()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            self.log("Ctrl-C: stopping after this step with a checkpoint (Ctrl-C again to "
                     "stop at once)")

        return signal.signal(signal.SIGINT, stop)

    def _run(self) -> None:
        cfg = self.cfg
        if cfg.eval_every and self.start_step == 0:
            self.evaluate(after_step=-1)
        if not cfg.sync:
            self.producer.start()
        for step in range(self.start_step, cfg.steps):
            if self._stop.is_set():
                return
            t0 = time.perf_counter()
            groups, dynamic = self.gather()
            t1 = time.perf_counter()
            lag = _staleness(groups, self.trainer.version)
            stats = {**self.trainer.step(groups), **dynamic}
            self._report(groups)
            t2 = time.perf_counter()
            pushed = (step + 1) % cfg.sync_every == 0 or step == cfg.steps - 1
            if pushed:
                self.push()
            t3 = time.perf_counter()
            self.write_step(step, groups, stats, lag, (t0, t1, t2, t3))
            if cfg.eval_every and ((step + 1) % cfg.eval_every == 0 or step == cfg.steps - 1):
                self.evaluate(after_step=step)
            self._steps_done = step + 1
            every = cfg.checkpoint_every
            if step == cfg.steps - 1 or (pushed if every is None else (step + 1) % every == 0):
                self.checkpoint(step + 1)

    # -- checkpoints --------------------------------------------------------------------------

    def checkpoint(self, steps: int) -> None:
        """The run after `steps` optimizer steps, as one checkpoint (resume.py): the trainer's
        state and the window's consumed groups, the loop's state, metrics.jsonl so far. Only
        at a step boundary, where every consumed group is settled."""
        out = self.cfg.out
        t0 = time.perf_counter()
        state = {"step": steps, "run_id": self.ledger.run_id, "envs": self.ledger.envs,
                 "settled": self.ledger.settled_counts(), "python_rng": random.getstate(),
                 "wall_s": round(time.perf_counter() - self._started, 3),
                 "rows": len(self.rows)}
        folder = checkpoint_folder(out, steps)
        self.trainer.save_checkpoint(folder, self.window, extra={"loop": state},
                                     files={"metrics.jsonl": out / "metrics.jsonl"})
        prune_checkpoints(out, self.cfg.keep_checkpoints)
        self.log(f"checkpoint {folder.name} ({time.perf_counter() - t0:.1f}s)")

    # -- taking groups ------------------------------------------------------------------------

    def gather(self) -> tuple[list[Group], dict[str, float]]:
        """The step's groups. With --dynamic-sampling (DAPO's dynamic sampling), groups that
        would train nothing (every sample scored alike, or dropped by a filter) do not count
        towards --groups: more are taken until it has --groups that train, or until
        --dynamic-sampling-max extra groups were taken. Those are consumed like any other (the
        trainer drops and counts them, the ledger settles them), so nothing is trained twice
        after a resume. Returns the groups and the counts for the step's row."""
        cfg = self.cfg
        groups = self._take_step(cfg.groups)
        if not cfg.dynamic_sampling:
            return groups, {}
        bound = cfg.dynamic_sampling_max if cfg.dynamic_sampling_max is not None \
            else 2 * cfg.groups
        extra = 0
        while (short := cfg.groups - self._with_signal(groups)) > 0 and extra < bound:
            more = self._take_step(min(short, bound - extra))
            if not more:
                break
            extra += len(more)
            groups += more
        return groups, {"dynamic/extra_groups": float(extra),
                        "dynamic/signal_groups": float(self._with_signal(groups)),
                        "dynamic/bound_reached": float(extra >= bound)}

    def _take_step(self, n: int) -> list[Group]:
        if self.cfg.sync:
            # a resumed run first trains the finished groups it has not trained yet
            missing = n - len(self.window.ready())
            if missing > 0:
                self.producer.run_groups(missing)
            return self.take(n, wait=False)
        return self.take(n, wait=True)

    def _with_signal(self, groups: list[Group]) -> int:
        """How many of `groups` the trainer would train on (its own filters, no model)."""
        from envhub.trainer.batch import build_batch

        return sum(build_batch([g], self.trainer.config, self.trainer.version).n_groups
                   for g in groups)

    def take(self, n: int, wait: bool) -> list[Group]:
        """`n` groups from the window; with `wait`, block until enough are finished inside it
        (the head moves only when consumed). Without, whatever the window allows now."""
        taken: list[Group] = []
        while len(taken) < n:
            seen = self.ledger.finished
            taken += self.window.take(n - len(taken))
            self._release([g.group_id for g in taken])
            if len(taken) >= n or not wait:
                break
            if self._stop.is_set():  # Ctrl-C: what this step took goes back to the window
                self.window.restore(set(self.window.consumed) - {g.group_id for g in taken})
                raise Interrupted
            if self.on_wait is not None:
                self.on_wait(wait_state(self.window, self.source.list_groups()))
            self.producer.wait_change(seen, POLL_S)
        self.producer.check()
        return taken

    def _release(self, taken: list[str]) -> None:
        # Groups with no session at all are passed (nothing to train on) and freed too.
        empty = self.window.skip(self.source.empty_done())
        self.ledger.release([*taken, *sorted(empty)])
        for gid in sorted(empty - set(taken)):  # nothing trained of a group with no session
            self.ledger.settle(gid, 0.0)

    def _report(self, groups: list[Group]) -> None:
        """Settle each group in the ledger (and the per-task metrics): how many of its samples
        the step trained (the trainer's filters: none of a dropped or no-signal group) and how
        many it dropped as stale."""
        fates = self.trainer.last_fates
        for g in groups:
            fate = fates[g.group_id]
            self.ledger.settle(g.group_id, fate.trained, fate.stale)
            if self.metrics is not None:
                env = self.ledger.env_of(g.group_id)
                self.metrics.trained.labels(env).inc(fate.trained)
                self.metrics.stale.labels(env).inc(fate.stale)

    # -- weights ------------------------------------------------------------------------------

    def push(self, bump: bool = True) -> None:
        """Export the weights (as the next version; without `bump`, as the current one: a
        resumed run serves its checkpoint's again), push them, keep the newest few."""
        import httpx
        from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

        from envhub.orchestrator.training.outputs import prune_weights

        def busy(e: BaseException) -> bool:  # 503: no engine in rotation (a heartbeat the
            # loaded machine answered late took it out until the next one); 429: still draining
            return isinstance(e, httpx.HTTPStatusError) and e.response.status_code in (429, 503)

        @retry(retry=retry_if_exception(busy), stop=stop_after_attempt(PUSH_ATTEMPTS),
               wait=wait_exponential(min=2, max=30), reraise=True)
        def post(path: str) -> None:
            failpoints.hit("weights.push")  # exported, not yet served
            version = int(Path(path).name.lstrip("v"))
            r = httpx.post(self.push_url, json={"path": path, "version": version},
                           headers={"authorization": f"Bearer {self.admin_key}"}, timeout=600)
            r.raise_for_status()

        self.trainer.sync(self.cfg.out / "weights", push=post, bump=bump)
        prune_weights(self.cfg.out / "weights", self.cfg.keep_weights)

    # -- rows ---------------------------------------------------------------------------------

    def write_step(self, step: int, groups: list[Group], stats: dict[str, Any],
                   lag: dict[str, float], times: tuple[float, float, float, float]) -> None:
        from envhub.orchestrator.training.outputs import append_row, append_rows

        t0, t1, t2, t3 = times
        by_env: dict[str, list[RolloutRecord]] = {}
        for g in groups:
            by_env.setdefault(self.ledger.env_of(g.group_id), []).extend(
                self.ledger.records(g.group_id))
        row: dict[str, Any] = {"phase": "train", "step": step,
                               "weight_version": self.trainer.version,
                               "ranks": getattr(self.trainer, "ranks", 1),
                               **step_metrics(by_env, stats), **lag, **self.dtypes,
                               "groups_trained": len(groups),
                               "groups": [g.group_id for g in groups],
                               # asynchronous: the trainer's wait for groups (its idle time)
                               "rollout_s": round(t1 - t0, 3), "train_s": round(t2 - t1, 3),
                               "push_s": round(t3 - t2, 3),
                               "wall_s": round(t3 - self._started, 3),
                               "in_flight": self.producer.in_flight,
                               "queued": self.producer.queued,
                               "groups_launched": self.ledger.launched,
                               **self._mix_row()}
        self.rows.append(row)
        append_row(self.cfg.out, row)
        self._written(row)
        samples = self._samples(step, groups)
        append_rows(self.cfg.out / "samples.jsonl", samples)  # envhub view's sample table
        if self.trackers is not None:
            self.trackers.samples(step + 1, samples)
        self.log(f"step {step:>3}  reward {row['reward_mean']:+.3f}  resolved "
                 f"{row['resolved_rate']:.2f}  groups {len(groups)}  stale "
                 f"{int(row['filter/stale'])}  wait {t1 - t0:.1f}s  train {t2 - t1:.1f}s  "
                 f"v{self.trainer.version}")

    def _written(self, row: dict[str, Any]) -> None:
        if self.on_row is not None:
            self.on_row(row)
        if self.trackers is not None:
            self.trackers.row(row)

    def _samples(self, step: int, groups: list[Group]) -> list[dict[str, Any]]:
        """A few of the step's rollouts (OUT/samples.jsonl, the trackers): each of the first
        groups' first sample, its last turn's prompt tail and completion, its reward and
        components."""
        out: list[dict[str, Any]] = []
        for g in groups[:SAMPLES_PER_STEP]:
            if not g.trajectories or not g.trajectories[0].turns:
                continue
            t = g.trajectories[0]
            last = t.turns[-1]
            record = next((r for r in self.ledger.records(g.group_id)
                           if r.session_id == t.session.id), None)
            components = dict(record.components) if record is not None else {}
            out.append({"step": step, "group": g.group_id, "sample": t.session.sample_index,
                        "prompt_tail": self._text(last.prompt_delta_ids)[-PROMPT_TAIL:],
                        "completion": (last.completion_text
                                       or self._text(last.completion_ids))[:COMPLETION],
                        "reward": components.get("total"), "components": components})
        return out

    def _text(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return " ".join(map(str, ids))
        return str(self.tokenizer.decode(ids))

    def _mix_row(self) -> dict[str, float]:
        """Per environment: samples trained so far, their share, groups launched, samples
        dropped as stale (the ledger's counts; also for a single environment, for
        `envhub view`'s per-task table)."""
        counts, shares = self.ledger.counts(), self.ledger.shares()
        row: dict[str, float] = {}
        for name, c, share in zip(self.ledger.envs, counts, shares, strict=True):
            row[f"mix/{name}/trained_samples"] = c.trained
            row[f"mix/{name}/trained_share"] = round(share, 4)
            row[f"mix/{name}/launched_groups"] = c.launched
            row[f"mix/{name}/stale_samples"] = c.stale
        admit = getattr(self.producer, "admit", None)  # the difficulty filter, if any
        if admit is not None:
            row["difficulty/passed_tasks"] = admit.passed
        return row

    def evaluate(self, after_step: int) -> None:
        from envhub.orchestrator.training.outputs import append_row

        assert self.producer.runner is not None
        t0 = time.perf_counter()
        metrics = self.producer.call(evaluate(self.producer.runner, self.envs,
                                              self.trainer.version, self.cfg.concurrency,
                                              self.eval_agent, self.cfg.eval_samples,
                                              self.cfg.eval_greedy, seed=self.cfg.seed))
        row = {"phase": "eval", "after_step": after_step,
               "weight_version": self.trainer.version, **metrics,
               "eval_s": round(time.perf_counter() - t0, 3)}
        self.rows.append(row)
        append_row(self.cfg.out, row)
        self._written(row)
        self.log(f"eval after step {after_step:>3}  v{self.trainer.version}  reward "
                 f"{row['eval/reward_mean']:+.3f}  resolved {row['eval/resolved_rate']:.2f} "
                 f"({int(row['eval/rollouts'])} held-out rollouts"
                 f"{', greedy' if self.cfg.eval_greedy else ''})")


def _staleness(groups: list[Group], version: int) -> dict[str, float]:
    """How many versions behind the trainer the taken samples' oldest tokens are, and how many
    samples were generated by more than one weight version (a push landed mid-rollout)."""
    lags, mixed = [], 0
    for g in groups:
        for t in g.trajectories:
            w0 = oldest_version(t)
            if w0 is not None:
                lags.append(version - w0)
            versions = {v for seg in t.segments
                        for v, m in zip(seg.weight_versions, seg.loss_mask, strict=True) if m}
            mixed += len(versions) > 1
    return {"staleness/mean": statistics.fmean(lags) if lags else 0.0,
            "staleness/max": float(max(lags, default=0)), "versions/mixed_samples": float(mixed)}
