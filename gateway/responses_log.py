"""Stored Responses API objects: `previous_response_id` chains and GET/DELETE by id.

Rows live in the pool (schema.responses), so a chain survives a gateway restart; recently
used ones are kept in memory. A response stores only the input items after its link: the
explicit `previous_response_id`, or — for clients that resend the whole conversation each
turn, as the Agents SDK does — the session's previous response when its conversation is a
prefix of the new input. Stored items thus grow with unique items, not with turns². The
conversation of a response is the walk of links, oldest first, input then output of each.
Deleting leaves a tombstone: gone for GET and for `previous_response_id`, still read by the
responses that link to it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import TypeAdapter

from envhub.gateway.errors import BadRequest
from envhub.gateway.models.responses import InputItem
from envhub.gateway.pool.rows import response_insert
from envhub.gateway.pool.store import Store, op_delete_response

ITEMS: TypeAdapter[list[Any]] = TypeAdapter(list[InputItem])
_MAX_CHAIN = 100_000  # links walked before a cycle (impossible by construction) is assumed


@dataclass
class StoredResponse:
    id: str
    session_id: str
    previous_id: str | None  # the link whose conversation precedes `input`
    body: dict[str, Any]  # the response object as returned
    input: list[dict[str, Any]]  # input items after the link's conversation (with ids)
    deleted: bool = False


def fingerprint(items: list[Any]) -> list[bytes]:
    """Per validated item, a digest of everything but its id (clients echo ours, or none)."""
    return [hashlib.blake2b(orjson.dumps(item.model_dump(exclude={"id"}),
                                         option=orjson.OPT_SORT_KEYS), digest_size=8).digest()
            for item in items]


class ResponseLog:
    def __init__(self, store: Store, cached: int = 4096):
        self.store = store
        self.cached = cached
        self._recent: OrderedDict[str, StoredResponse] = OrderedDict()
        # session id → (its latest stored response, fingerprint of that one's conversation):
        # a resent conversation is recognised without walking the chain
        self._latest: dict[str, tuple[str, list[bytes]] | None] = {}

    def _remember(self, stored: StoredResponse) -> None:
        self._recent[stored.id] = stored
        self._recent.move_to_end(stored.id)
        while len(self._recent) > self.cached:
            self._recent.popitem(last=False)

    async def get(self, response_id: str) -> StoredResponse | None:
        """The stored response, tombstones included (callers decide)."""
        stored = self._recent.get(response_id)
        if stored is not None:
            return stored
        row = await self.store.read(self.store.response_row, response_id)
        if row is None:
            return None
        stored = StoredResponse(row["id"], row["session_id"], row["previous_id"],
                                orjson.loads(row["body"]), orjson.loads(row["input"]),
                                bool(row["deleted"]))
        self._remember(stored)
        return stored

    async def save(self, stored: StoredResponse, conversation: list[Any]) -> None:
        """Store a response; `conversation`: its validated input items, whole."""
        await self.store.write(response_insert(
            stored.id, stored.session_id, previous_id=stored.previous_id, body=stored.body,
            input_items=stored.input))
        self._remember(stored)
        self._latest[stored.session_id] = (stored.id, fingerprint(
            conversation + ITEMS.validate_python(stored.body["output"])))

    async def delete(self, stored: StoredResponse) -> None:
        await self.store.write(op_delete_response(stored.id))
        stored.deleted = True

    async def conversation(self, last: StoredResponse) -> list[dict[str, Any]]:
        """Every item of the chain ending at `last`: input then output of each, oldest first."""
        links = [last]
        while links[-1].previous_id is not None and len(links) < _MAX_CHAIN:
            prev = await self.get(links[-1].previous_id)
            if prev is None:
                raise BadRequest(f"the stored conversation is incomplete: response "
                                 f"{links[-1].previous_id!r} is missing from the pool",
                                 param="previous_response_id",
                                 code="previous_response_not_found")
            links.append(prev)
        return [item for link in reversed(links)
                for item in (*link.input, *link.body["output"])]

    async def implicit_base(self, session_id: str, items: list[Any]
                            ) -> tuple[StoredResponse | None, list[Any]]:
        """(the session's latest response, the items after its conversation) when that
        conversation starts `items`; else (None, items)."""
        if session_id not in self._latest:  # first request since the gateway started
            latest_id = await self.store.read(self.store.latest_response_id, session_id)
            latest = await self.get(latest_id) if latest_id is not None else None
            self._latest[session_id] = None if latest is None else (latest.id, fingerprint(
                ITEMS.validate_python(await self.conversation(latest))))
        known = self._latest[session_id]
        if known is None or len(known[1]) > len(items) \
                or fingerprint(items[:len(known[1])]) != known[1]:
            return None, items
        base = await self.get(known[0])
        return (base, items[len(known[1]):]) if base is not None else (None, items)
