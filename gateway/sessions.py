"""Live sessions: authentication by per-session key, lazy history loading, creation.

Keys are stored hashed. Without an admin key (local use) an unknown bearer token opens a
session whose id and key are that token, so `OPENAI_API_KEY=run-42` is all an agent needs.

Histories are cached per process; with several gateway processes on one pool a history is
loaded under a lease (pool/leases.py) and reloaded when another process has taken the session.
A context action the agent declared is kept in the pool (pool/declared.py) and applied by
whichever process loads the history next.

A session created with metadata `{"trainable": false}` (admin key: a model judge's calls,
envs/rewards/judge) records every turn as not trainable, whatever the backend says.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import uuid
from dataclasses import dataclass, field

import orjson

from envhub.gateway.errors import BadRequest, Conflict, NotFound, Unauthorized
from envhub.gateway.history import History
from envhub.gateway.pool.declared import pending
from envhub.gateway.pool.leases import new_token, op_claim
from envhub.gateway.pool.rows import session_insert
from envhub.gateway.pool.store import IntegrityError, Store
from envhub.gateway.pool.trajectory import history_from_rows
from envhub.gateway.render.messages import MessageMemo
from envhub.sdk.types import CMAction

_MAX_ID = 128


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass
class LiveSession:
    id: str
    key_hash: str
    status: str = "open"
    history: History | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    loading: asyncio.Lock = field(default_factory=asyncio.Lock)  # one history load at a time
    memo: MessageMemo = field(default_factory=MessageMemo)
    trainable: bool = True  # False: metadata {"trainable": false}, every turn not trainable
    group_id: str = ""  # the RL group it samples for: the engine drafts from the group's text
    # calls of this session this process refused because the pool could not record them (503):
    # in memory, since the pool is what failed; the runner reads it (GET /sessions/{id}/pool_faults)
    pool_refused: int = 0
    pool_fault: str | None = None


def _trainable(metadata: dict | None) -> bool:
    """A session's turns are trainable unless its metadata says `"trainable": false`."""
    return (metadata or {}).get("trainable") is not False


class Sessions:
    def __init__(self, store: Store, admin_key: str | None, holder: str = ""):
        self.store = store
        self.admin_key = admin_key
        self.holder = holder  # this gateway process, recorded on the leases it takes
        self._by_key: dict[str, LiveSession] = {}
        self._by_id: dict[str, LiveSession] = {}
        self._opening: dict[str, asyncio.Lock] = {}

    def is_admin(self, token: str | None) -> bool:
        return self.admin_key is not None and token is not None and secrets.compare_digest(
            token, self.admin_key)

    async def create(self, *, session_id: str | None = None, api_key: str | None = None,
                     group_id: str | None = None, task_id: str | None = None,
                     env: str | None = None, sample_index: int = 0,
                     metadata: dict | None = None) -> tuple[LiveSession, str]:
        sid = session_id or uuid.uuid4().hex
        if not 0 < len(sid) <= _MAX_ID or any(c.isspace() or c == "/" for c in sid):
            raise BadRequest(f"session id must be 1-{_MAX_ID} characters without spaces or '/'",
                             param="session_id")
        key = api_key or f"sk-envhub-{secrets.token_urlsafe(24)}"
        lease = new_token()
        live = LiveSession(sid, key_hash(key), history=History(lease=lease),
                           trainable=_trainable(metadata), group_id=group_id or "")
        row = session_insert(sid, live.key_hash, group_id=group_id, task_id=task_id, env=env,
                             sample_index=sample_index, metadata=metadata)
        try:
            await self.store.write(row, op_claim(sid, lease, self.holder, new=True))
        except IntegrityError:
            raise Conflict(f"session {sid!r} already exists; choose another id") from None
        self._remember(live)
        return live, key

    def _remember(self, live: LiveSession) -> None:
        self._by_key[live.key_hash] = live
        self._by_id[live.id] = live

    def _live_from_row(self, row: dict) -> LiveSession:
        live = self._by_id.get(row["id"])
        if live is None:
            live = LiveSession(row["id"], row["key_hash"], row["status"],
                               trainable=_trainable(orjson.loads(row.get("metadata") or "{}")),
                               group_id=row.get("group_id") or "")
            self._remember(live)
        return live

    def cached(self, token: str | None) -> LiveSession | None:
        """The session of this key if this process holds it, without reading the pool."""
        return self._by_key.get(key_hash(token)) if token else None

    def cached_id(self, session_id: str) -> LiveSession | None:
        return self._by_id.get(session_id)

    async def by_key(self, token: str) -> LiveSession | None:
        """The existing session this key belongs to, or None; never opens one."""
        kh = key_hash(token)
        live = self._by_key.get(kh)
        if live is not None:
            return live
        row = await self.store.read(self.store.session_by_key, kh)
        return self._live_from_row(row) if row is not None else None

    async def authenticate(self, token: str | None) -> LiveSession:
        """The session a bearer token belongs to; opens one in local mode."""
        if not token:
            if self.admin_key is not None:
                raise Unauthorized("missing API key: send the session's key as a bearer token "
                                   "(or x-api-key); create sessions with POST /sessions")
            token = "default"
        live = await self.by_key(token)
        if live is not None:
            return live
        kh = key_hash(token)
        if self.admin_key is not None:
            raise Unauthorized("unknown API key: create a session with POST /sessions (admin "
                               "key) and use the api_key it returns")
        lock = self._opening.setdefault(kh, asyncio.Lock())
        async with lock:  # two first requests with one new token open one session
            if kh in self._by_key:
                return self._by_key[kh]
            try:
                live, _ = await self.create(session_id=token[:_MAX_ID].replace("/", "_"),
                                            api_key=token)
            except Conflict:
                # another gateway process on this pool opened it a moment ago: same key
                if (live := await self.by_key(token)) is not None:
                    return live
                raise Unauthorized(
                    "this token names an existing session with another key") from None
            return live

    async def get(self, session_id: str) -> LiveSession:
        live = self._by_id.get(session_id)
        if live is not None:
            return live
        row = await self.store.read(self.store.session_row, session_id)
        if row is None:
            raise NotFound(f"no session {session_id!r}")
        return self._live_from_row(row)

    async def history(self, live: LiveSession) -> History:
        """The session's history for recording turns; loaded from the pool on first use here,
        under a fresh lease claimed before reading."""
        if live.history is not None:
            return live.history
        async with live.loading:
            if live.history is None:
                lease = new_token()
                await self.store.write(op_claim(live.id, lease, self.holder))
                rows = await self.store.read(self.store.turn_rows, live.id)
                actions = await self.store.read(self.store.events, "cm_actions", live.id)
                info = await self.store.read(self.store.events, "turn_info", live.id)
                history = history_from_rows(rows, actions, info)
                # an action the agent declared through another process (pool/declared.py)
                declared = await self.store.read(pending, self.store, live.id, actions)
                if declared is not None:
                    history.declared = CMAction(**declared)
                history.lease = lease
                live.history = history
        return live.history


async def forget_history(store: Store, live: LiveSession, stale: History) -> None:
    """Another process took the session (its lease changed): forget `stale` and re-read the
    session's status, so the next call reloads both from the pool."""
    async with live.loading:
        if live.history is stale:
            live.history = None
        row = await store.read(store.session_row, live.id)
        if row is not None:
            live.status = row["status"]
