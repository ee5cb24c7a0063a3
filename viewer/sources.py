"""What the viewer reads: run folders written by `envhub run`, or a pool URL.

A run folder (`runs/<run_id>/`) holds run.json (id and options), rollouts/*.json (one record
per rollout: status, reason, reward components) and, when the run started its own gateway,
pool.db (every model call's token ids). PATH may be one run folder or a folder of them
(`runs/`). A pool URL (sqlite:///FILE, postgresql://...) is read through the pool's Store;
its sessions are grouped into runs by the run id that `envhub run` puts before the first ':'
of each group id.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import select

from envhub.gateway.config import BUNDLED_MODEL
from envhub.gateway.pool import schema as t
from envhub.gateway.pool.store import Store
from envhub.gateway.pool.trajectory import build_trajectory
from envhub.sdk.types import RUNNER, RewardEvent, Trajectory
from envhub.viewer.errors import ViewerError

MAX_POOL_SESSIONS = 20000  # sessions listed from one pool (the page says when it is cut)


@dataclass
class RunSummary:
    run_id: str
    where: str
    agent: str = ""
    model: str = ""
    started_at: float | None = None
    counts: dict[str, int] = field(default_factory=dict)  # status -> sessions
    mean_reward: float | None = None
    resolved: int = 0
    sessions: int = 0
    envs: list[str] = field(default_factory=list)
    tasks: list[TaskSummary] = field(default_factory=list)


@dataclass
class TaskSummary:
    """One environment (task) of a run: its rollouts and, for `envhub train`, what the trainer
    made of them (the last step's `mix/<env>/...` of metrics.jsonl)."""

    env: str
    sessions: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # status -> sessions
    mean_reward: float | None = None
    resolved: int = 0
    mean_duration_s: float | None = None
    training: dict[str, float] = field(default_factory=dict)  # trained_samples, ...


@dataclass
class SessionRow:
    run_id: str
    key: str  # the URL key: the rollout record's name, or the pool session id
    session_id: str | None
    env: str
    task_id: str
    sample: int
    status: str
    reason: str | None
    reward: float | None
    components: dict[str, float]
    turns: int | None
    resolved: bool | None = None
    group_id: str | None = None
    duration_s: float | None = None


@dataclass
class SessionView:
    row: SessionRow
    trajectory: Trajectory | None
    record: dict[str, Any] | None
    tokenizer: Path
    note: str | None = None


def open_source(text: str, tokenizer: Path | None = None) -> RunFolders | PoolSource:
    """The source named on the command line; ViewerError with the fix when it is unusable."""
    if "://" in text:
        return PoolSource(text, tokenizer)
    return RunFolders(Path(text), tokenizer)


def _open_store(url: str) -> Store:
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file():
        raise ViewerError(f"{url}: no such pool file; give the pool.db of a run, e.g. "
                          "sqlite:///runs/<run_id>/pool.db")
    if not url.startswith(("sqlite:///", "postgresql://", "postgresql+psycopg://")):
        raise ViewerError(f"{url}: not a pool URL; use sqlite:///FILE or postgresql://...")
    try:
        tables = _tables(url)
    except Exception as e:  # not a database, wrong password, server down: the driver says which
        raise ViewerError(f"{url}: cannot read the pool ({type(e).__name__}: {e})") from e
    if not {"sessions", "turns"} <= tables:
        # Store() would create the pool's tables in it: never write into someone else's file
        raise ViewerError(f"{url}: not an envhub pool (no sessions/turns tables); give the "
                          "--db URL of a gateway or a run's pool.db")
    return Store(url)


def _tables(url: str) -> set[str]:
    """Table names in the database at `url`, read without creating anything."""
    import sqlalchemy as sa

    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    engine = sa.create_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _reward_events(store: Store, session_ids: list[str] | None = None
                   ) -> dict[str, list[RewardEvent]]:
    """Reward events per session in one query (a list page must not cost a query per row)."""
    q = select(t.rewards.c.session_id, t.rewards.c.body).order_by(t.rewards.c.id)
    if session_ids is not None:
        q = q.where(t.rewards.c.session_id.in_(session_ids))
    out: dict[str, list[RewardEvent]] = {}
    with store.engine.connect() as c:
        for sid, body in c.execute(q):
            out.setdefault(sid, []).append(RewardEvent(**orjson.loads(body)))
    return out


def _pool_row(run_id: str, row: dict, events: list[RewardEvent]) -> SessionRow:
    # as the trainer: only the runner's events (the weight shown is the one the runner applied
    # from the manifest, recorded on its events)
    events = [e for e in events if e.writer == RUNNER]
    components: dict[str, float] = {}
    for e in events:
        if e.kind != "reward_to_go":
            components[e.kind] = components.get(e.kind, 0.0) + e.value
    reward = None
    if components:
        reward = sum((e.weight if e.weight is not None else 1.0) * e.value
                     for e in events if e.kind != "reward_to_go")
        components["total"] = reward
    return SessionRow(run_id=run_id, key=row["id"], session_id=row["id"], env=row["env"] or "",
                      task_id=row["task_id"] or "", sample=row["sample_index"] or 0,
                      status=row["status"], reason=row["reason"], reward=reward,
                      components=components, turns=None, group_id=row["group_id"])


def _pool_rows(store: Store, run_of: Callable[[dict], str]) -> list[SessionRow]:
    raw = store.list_sessions(limit=MAX_POOL_SESSIONS)
    events = _reward_events(store)
    return [_pool_row(run_of(r), r, events.get(r["id"], [])) for r in raw]


def _pool_view(store: Store, row: SessionRow, tokenizer: Path,
               record: dict[str, Any] | None = None) -> SessionView:
    session = store.session_row(row.session_id) if row.session_id else None
    if session is None:
        note = ("this rollout has no gateway session (it failed before its agent started)"
                if row.session_id is None else f"session {row.session_id} is not in the pool")
        return SessionView(row, None, record, tokenizer, note)
    return SessionView(row, build_trajectory(store, session), record, tokenizer)


def _summarize(run: RunSummary, rows: list[SessionRow],
               training: dict[str, float] | None = None) -> RunSummary:
    """Counts, mean reward and resolved over `rows`, for the run and for each environment;
    `training`: the last training step's row (its `mix/<env>/...`), if the run trained."""
    run.sessions, run.counts, run.mean_reward, run.resolved = _totals(rows)
    run.envs = sorted({r.env for r in rows})
    for env in run.envs:
        mine = [r for r in rows if r.env == env]
        task = TaskSummary(env)
        task.sessions, task.counts, task.mean_reward, task.resolved = _totals(mine)
        durations = [r.duration_s for r in mine if r.duration_s is not None]
        task.mean_duration_s = sum(durations) / len(durations) if durations else None
        prefix = f"mix/{env}/"
        task.training = {k.removeprefix(prefix): float(v) for k, v in (training or {}).items()
                         if k.startswith(prefix) and isinstance(v, (int, float))}
        run.tasks.append(task)
    return run


def _totals(rows: list[SessionRow]) -> tuple[int, dict[str, int], float | None, int]:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    rewards = [r.reward for r in rows if r.status == "done" and r.reward is not None]
    mean = sum(rewards) / len(rewards) if rewards else None
    return len(rows), counts, mean, sum(1 for r in rows if r.resolved)


def last_training_step(folder: Path) -> dict[str, Any]:
    """The last `"phase": "train"` row of an `envhub train` folder's metrics.jsonl ({} when
    there is none, or the file is unreadable)."""
    try:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(row, dict) and row.get("phase") == "train":
            return row
    return {}


class RunFolders:
    """One run folder, or a folder of them."""

    def __init__(self, path: Path, tokenizer: Path | None = None) -> None:
        if not path.exists():
            raise ViewerError(f"{path}: no such folder; give a run folder (runs/<run_id>), "
                              "the runs/ folder, or a pool URL (sqlite:///FILE)")
        if not path.is_dir():
            raise ViewerError(f"{path}: not a folder; give a run folder (runs/<run_id>), the "
                              "runs/ folder, or a pool file as sqlite:///" + str(path))
        self.folders: dict[str, Path] = {}
        for folder in [path] if _is_run(path) else sorted(p for p in path.iterdir()
                                                          if p.is_dir() and _is_run(p)):
            run_id = _run_id(folder)
            self.folders[folder.name if run_id in self.folders else run_id] = folder
        if not self.folders:
            raise ViewerError(f"{path}: no run here (a run folder holds run.json and rollouts/ "
                              "as `envhub run` writes them); give runs/<run_id> or runs/")
        self.tokenizer = tokenizer
        self._stores: dict[str, Store | None] = {}
        self._rows: dict[str, tuple[tuple[int, ...], list[SessionRow]]] = {}
        self._records: dict[tuple[str, str], dict[str, Any]] = {}

    def close(self) -> None:
        for store in self._stores.values():
            if store is not None:
                store.close()

    def _store(self, run_id: str) -> Store | None:
        if run_id not in self._stores:
            db = self.folders[run_id] / "pool.db"
            self._stores[run_id] = _open_store(f"sqlite:///{db}") if db.is_file() else None
        return self._stores[run_id]

    def _options(self, run_id: str) -> dict[str, Any]:
        meta = self.folders[run_id] / "run.json"
        try:
            return dict(json.loads(meta.read_text()).get("options") or {})
        except (OSError, ValueError, AttributeError):
            return {}

    def tokenizer_for(self, run_id: str) -> Path:
        """--tokenizer, else the run's --model folder, else the bundled model (also what the
        zero backend and text-only hosted models are recorded with)."""
        if self.tokenizer is not None:
            return self.tokenizer
        model = self._options(run_id).get("model")
        if model and Path(model).expanduser().is_dir():
            return Path(model).expanduser()
        return BUNDLED_MODEL

    def runs(self) -> list[RunSummary]:
        out = []
        for run_id, folder in self.folders.items():
            options = self._options(run_id)
            model = options.get("model") or "(bundled)"
            run = RunSummary(run_id, str(folder), agent=str(options.get("agent") or ""),
                             model=str(model))
            out.append(_summarize(run, self.sessions(run_id),
                                  last_training_step(self.folders[run_id])))
        return out

    def sessions(self, run_id: str | None = None) -> list[SessionRow]:
        rows: list[SessionRow] = []
        for rid in self.folders if run_id is None else [run_id]:
            # read again when the run wrote since (a run in progress shows its new rollouts)
            stamp = _stamp(self.folders[rid])
            if rid not in self._rows or self._rows[rid][0] != stamp:
                self._rows[rid] = (stamp, self._load_rows(rid))
            rows += self._rows[rid][1]
        return rows

    def _load_rows(self, run_id: str) -> list[SessionRow]:
        rows, seen = [], set()
        rollouts = self.folders[run_id] / "rollouts"
        for file in sorted(rollouts.glob("*.json")) if rollouts.is_dir() else []:
            if file.name.startswith("."):  # the runner's temp files
                continue
            try:
                rec = json.loads(file.read_text())
            except (OSError, ValueError):
                continue  # half-written by a killed run: the runner reruns it on --resume
            self._records[(run_id, file.stem)] = rec
            comps = {k: float(v) for k, v in (rec.get("components") or {}).items()}
            rows.append(SessionRow(
                run_id=run_id, key=file.stem, session_id=rec.get("session_id"),
                env=str(rec.get("env", "")), task_id=str(rec.get("task_id", "")),
                sample=int(rec.get("sample", 0)), status=str(rec.get("status", "")),
                reason=rec.get("reason"), reward=comps.get("total"), components=comps,
                turns=rec.get("turns"), resolved=rec.get("resolved"),
                group_id=rec.get("group_id"), duration_s=_float(rec.get("duration_s"))))
            seen.add(rec.get("session_id"))
        store = self._store(run_id)
        if store is not None:  # sessions without a record yet (a run still going or killed)
            rows += [r for r in _pool_rows(store, lambda _: run_id) if r.key not in seen]
        return rows

    def session(self, run_id: str, key: str) -> SessionView | None:
        if run_id not in self.folders:
            return None
        row = next((r for r in self.sessions(run_id) if r.key == key), None)
        if row is None:
            return None
        record = self._records.get((run_id, key))
        tokenizer = self.tokenizer_for(run_id)
        store = self._store(run_id)
        if store is None:
            return SessionView(row, None, record, tokenizer,
                               "this run used an external gateway (--gateway): its token ids "
                               "are in that gateway's pool; view it with `envhub view "
                               "POOL_URL`")
        return _pool_view(store, row, tokenizer, record)


class PoolSource:
    """A pool URL; runs are the run ids before the first ':' of the group ids."""

    def __init__(self, url: str, tokenizer: Path | None = None) -> None:
        self.url = url
        self.store = _open_store(url)
        self.tokenizer = tokenizer
        self.cut = False

    def close(self) -> None:
        self.store.close()

    def tokenizer_for(self, run_id: str) -> Path:
        return self.tokenizer or BUNDLED_MODEL

    def sessions(self, run_id: str | None = None) -> list[SessionRow]:
        rows = _pool_rows(self.store, lambda r: _group_run(r["group_id"]))
        self.cut = len(rows) == MAX_POOL_SESSIONS
        return [r for r in rows if run_id is None or r.run_id == run_id]

    def runs(self) -> list[RunSummary]:
        by_run: dict[str, list[SessionRow]] = {}
        for r in self.sessions():
            by_run.setdefault(r.run_id, []).append(r)
        return [_summarize(RunSummary(rid, self.url), rows) for rid, rows in by_run.items()]

    def session(self, run_id: str, key: str) -> SessionView | None:
        row = self.store.session_row(key)
        if row is None:
            return None
        events = _reward_events(self.store, [key]).get(key, [])
        return _pool_view(self.store, _pool_row(_group_run(row["group_id"]), row, events),
                          self.tokenizer_for(run_id))


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None


def _group_run(group_id: str | None) -> str:
    return group_id.split(":", 1)[0] if group_id and ":" in group_id else "(no run id)"


def _stamp(folder: Path) -> tuple[int, ...]:
    """Changes whenever the runner writes a record (atomic renames touch rollouts/) or the
    pool commits (SQLite WAL)."""
    paths = (folder / "rollouts", folder / "pool.db", folder / "pool.db-wal")
    return tuple(p.stat().st_mtime_ns if p.exists() else 0 for p in paths)


def _is_run(folder: Path) -> bool:
    return (folder / "run.json").is_file() or (folder / "rollouts").is_dir()


def _run_id(folder: Path) -> str:
    try:
        return str(json.loads((folder / "run.json").read_text())["run_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return folder.name
