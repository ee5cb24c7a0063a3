"""Stored Responses API objects: `previous_response_id` chains and GET/DELETE by id.

Rows live in the pool (schema.responses), so a chain survives a gateway restart; recently
used ones are kept in memory. Each response stores only its own input items: its conversation
is the walk of `previous_id` links, oldest first, each link's input then output items.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import orjson

from envhub.gateway.errors import BadRequest
from envhub.gateway.pool.rows import response_insert
from envhub.gateway.pool.store import Store, op_delete_response

_MAX_CHAIN = 100_000  # links walked before a cycle (impossible by construction) is assumed


@dataclass
class StoredResponse:
    id: str
    session_id: str
    previous_id: str | None
    body: dict[str, Any]  # the response object as returned
    input: list[dict[str, Any]]  # this request's input items (with ids)


class ResponseLog:
    def __init__(self, store: Store, cached: int = 4096):
        self.store = store
        self.cached = cached
        self._recent: OrderedDict[str, StoredResponse] = OrderedDict()

    def _remember(self, stored: StoredResponse) -> None:
        self._recent[stored.id] = stored
        self._recent.move_to_end(stored.id)
        while len(self._recent) > self.cached:
            self._recent.popitem(last=False)

    async def get(self, response_id: str) -> StoredResponse | None:
        stored = self._recent.get(response_id)
        if stored is not None:
            return stored
        row = await asyncio.to_thread(self.store.response_row, response_id)
        if row is None:
            return None
        stored = StoredResponse(row["id"], row["session_id"], row["previous_id"],
                                orjson.loads(row["body"]), orjson.loads(row["input"]))
        self._remember(stored)
        return stored

    async def save(self, stored: StoredResponse) -> None:
        await self.store.write(response_insert(
            stored.id, stored.session_id, previous_id=stored.previous_id, body=stored.body,
            input_items=stored.input))
        self._remember(stored)

    async def delete(self, response_id: str) -> None:
        await self.store.write(op_delete_response(response_id))
        self._recent.pop(response_id, None)

    async def conversation(self, last: StoredResponse) -> list[dict[str, Any]]:
        """Every item of the chain ending at `last`: input then output of each, oldest first."""
        links = [last]
        while links[-1].previous_id is not None and len(links) < _MAX_CHAIN:
            prev = await self.get(links[-1].previous_id)
            if prev is None:
                raise BadRequest(f"the chain of previous responses is broken: "
                                 f"{links[-1].previous_id!r} (the previous response of "
                                 f"{links[-1].id!r}) was deleted", param="previous_response_id",
                                 code="previous_response_not_found")
            links.append(prev)
        return [item for link in reversed(links)
                for item in (*link.input, *link.body["output"])]
