"""Where trajectories come from: the `TrajectorySource` protocol and three implementations.

- `InMemorySource`: a dict of trajectories (tests, benchmarks, JSONL files).
- `HttpSource`: the gateway's HTTP API (`GET /sessions`, `GET /sessions/{id}/trajectory`,
  admin bearer key), for a trainer on another machine.
- `StoreSource`: the pool itself, in-process (a gateway's `Store`, or a pool URL such as
  `sqlite:///pool.db` / `postgresql://...`), read with the gateway's own trajectory builder.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from envhub.sdk.types import SessionInfo, SessionStatus, Trajectory
from envhub.trainer.errors import SourceError

if TYPE_CHECKING:
    from envhub.gateway.pool.store import Store

_PAGE = 1000  # sessions per listing call (the gateway's default page)


@dataclass(frozen=True)
class GroupInfo:
    """A group as listed by a source: enough to order and choose, no token data."""

    group_id: str
    sessions: tuple[SessionInfo, ...]

    @property
    def started_at(self) -> float:
        """When the group's rollouts started: the earliest session creation time."""
        return min((s.created_at for s in self.sessions), default=0.0)

    def finished(self, group_size: int | None = None) -> bool:
        """All listed sessions are closed (and, if given, at least `group_size` are listed)."""
        if group_size is not None and len(self.sessions) < group_size:
            return False
        return bool(self.sessions) and all(s.status != SessionStatus.open for s in self.sessions)


@dataclass
class Group:
    """A finished group with its trajectories, in sample_index order."""

    group_id: str
    trajectories: list[Trajectory] = field(default_factory=list)


@runtime_checkable
class TrajectorySource(Protocol):
    """Read side of the data pool."""

    def list_groups(self) -> list[GroupInfo]:
        """Every group with at least one session, ordered by `started_at` then group id."""
        ...

    def fetch(self, session_ids: Sequence[str]) -> list[Trajectory]:
        """Full trajectories of these sessions, in the order asked."""
        ...


def groups_from_sessions(sessions: Iterable[SessionInfo]) -> list[GroupInfo]:
    """Group session infos by group id (sessions without one are their own group)."""
    by_group: dict[str, list[SessionInfo]] = {}
    for s in sessions:
        by_group.setdefault(s.group_id or f"session:{s.id}", []).append(s)
    infos = [
        GroupInfo(gid, tuple(sorted(members, key=lambda s: (s.sample_index, s.id))))
        for gid, members in by_group.items()
    ]
    return sorted(infos, key=lambda g: (g.started_at, g.group_id))


def load_group(source: TrajectorySource, info: GroupInfo) -> Group:
    trajectories = source.fetch([s.id for s in info.sessions])
    return Group(info.group_id, trajectories)


class InMemorySource:
    """Trajectories held in memory; `add` appends (a session id seen again is replaced)."""

    def __init__(self, trajectories: Iterable[Trajectory] = ()) -> None:
        self._by_id: dict[str, Trajectory] = {}
        self.add(trajectories)

    def add(self, trajectories: Iterable[Trajectory]) -> None:
        for t in trajectories:
            self._by_id[t.session.id] = t

    @classmethod
    def from_jsonl(cls, path: str | Path) -> InMemorySource:
        """One Trajectory JSON object per line (the gateway's JSONL export)."""
        source = cls()
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    source.add([Trajectory.model_validate_json(line)])
                except ValueError as exc:
                    raise SourceError(
                        f"{path}:{n}: not a Trajectory JSON object ({exc}); export "
                        "trajectories with the gateway's JSONL export") from exc
        return source

    def list_groups(self) -> list[GroupInfo]:
        return groups_from_sessions(self._session_view(t) for t in self._by_id.values())

    def fetch(self, session_ids: Sequence[str]) -> list[Trajectory]:
        missing = [i for i in session_ids if i not in self._by_id]
        if missing:
            raise SourceError(f"unknown session ids {missing[:5]}; list groups again first")
        return [self._by_id[i] for i in session_ids]

    @staticmethod
    def _session_view(t: Trajectory) -> SessionInfo:
        # The trajectory's own status is authoritative (the session copy may predate closing).
        if t.session.status == t.status:
            return t.session
        return t.session.model_copy(update={"status": t.status})


class HttpSource:
    """The gateway's HTTP API, authenticated with the admin key (bearer)."""

    def __init__(self, base_url: str, admin_key: str | None = None, *,
                 timeout: float = 30.0) -> None:
        import httpx

        headers = {"authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.base_url = base_url.rstrip("/")
        self._client = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def sessions(self, group_id: str | None = None,
                 status: SessionStatus | str | None = None) -> list[SessionInfo]:
        """`GET /sessions?group_id=&status=` as SessionInfo objects."""
        params: dict[str, str] = {}
        if group_id is not None:
            params["group_id"] = group_id
        if status is not None:
            params["status"] = SessionStatus(status).value
        return [SessionInfo.model_validate(item) for item in self._pages(params)]

    def list_groups(self) -> list[GroupInfo]:
        return groups_from_sessions(self.sessions())

    def fetch(self, session_ids: Sequence[str]) -> list[Trajectory]:
        return [Trajectory.model_validate(self._get_json(f"/sessions/{sid}/trajectory"))
                for sid in session_ids]

    def _pages(self, params: dict[str, str]) -> Iterator[object]:
        """`GET /sessions` page by page (the gateway answers at most `limit` rows a call)."""
        offset = 0
        while True:
            body = self._get_json("/sessions", {**params, "limit": str(_PAGE),
                                                "offset": str(offset)})
            if isinstance(body, dict) and "data" in body:  # an OpenAI-style list envelope
                body = body["data"]
            if not isinstance(body, list):
                raise SourceError(f"{self.base_url}/sessions returned {type(body).__name__}, "
                                  "expected a JSON list of sessions; is this an envhub gateway?")
            yield from body
            if len(body) < _PAGE:
                return
            offset += len(body)

    def _get_json(self, path: str, params: dict[str, str] | None = None) -> object:
        import httpx

        try:
            response = self._client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise SourceError(f"cannot reach the gateway at {self.base_url} ({exc}); check "
                              "the URL and that `envhub serve` is running") from exc
        if response.status_code in (401, 403):
            raise SourceError(f"the gateway refused the admin key ({response.status_code}); "
                              "pass the gateway's admin key (--admin-key / ENVHUB_ADMIN_KEY)")
        if response.status_code >= 400:
            raise SourceError(f"GET {path} -> {response.status_code}: {response.text[:300]}")
        try:
            return response.json()
        except ValueError as exc:
            raise SourceError(f"GET {path} did not return JSON; is {self.base_url} "
                              "an envhub gateway?") from exc


class StoreSource:
    """The data pool read in-process: pass the gateway's `Store` (shared, not closed here) or a
    pool URL (opened here; `close` releases it). Trajectories are built by the same code that
    serves `GET /sessions/{id}/trajectory`, so both sources give identical objects."""

    def __init__(self, store: Store | str) -> None:
        from envhub.gateway.pool.store import Store

        self._owned = isinstance(store, str)
        try:
            self.store = Store(store) if isinstance(store, str) else store
        except Exception as exc:  # bad URL, unreachable database: say which and how to fix
            raise SourceError(f"cannot open the pool {store!r} ({exc}); pass a SQLAlchemy URL "
                              "such as sqlite:///pool.db or postgresql://user@host/db") from exc

    def close(self) -> None:
        if self._owned:
            self.store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list_groups(self) -> list[GroupInfo]:
        from envhub.gateway.pool.trajectory import session_info

        rows, offset = [], 0
        while True:
            page = self.store.list_sessions(limit=_PAGE, offset=offset)
            rows += page
            if len(page) < _PAGE:
                break
            offset += len(page)
        return groups_from_sessions(session_info(r) for r in rows)

    def fetch(self, session_ids: Sequence[str]) -> list[Trajectory]:
        from envhub.gateway.pool.trajectory import build_trajectory

        rows = [self.store.session_row(sid) for sid in session_ids]
        missing = [sid for sid, row in zip(session_ids, rows, strict=True) if row is None]
        if missing:
            raise SourceError(f"unknown session ids {missing[:5]}; list groups again first")
        return [build_trajectory(self.store, row) for row in rows if row is not None]
