"""A session's token history as a tree of turns, and how a new request relates to it.

Every turn leaves a *state*: the full token history after it (prompt + sampled completion) and
the identity of the message list that produced it (request messages + the assistant response).
A new request is matched against these states by rolling message hashes:

- it extends the state at the tip of a segment → same segment; prompt = that state's ids +
  ids of the appended messages only (previous ids kept verbatim, as sampled);
- it extends a state that was already extended, or repeats an earlier request → `fork`
  (retry / branch), a new segment that starts from those exact ids;
- it extends nothing → either a context-management action of one of the session's
  conversations (`truncate` / `summarize` / `rewrite` / `reset`, classified against that
  conversation's latest turn) or a new conversation; a new segment whose prompt is rendered in
  full either way.

Conversations ("chains"): black-box CLIs make side calls on the same key (a title or summary
request beside the main loop, sub-agents), and harnesses run several agents or several runs of
one CLI on one key. Each conversation is its own chain, a root of the session's tree; a chain's
id is the seq of its first turn. Whether a request that extends nothing rewrites a chain is
decided by content, never by its first message alone. Its *preamble* is its leading system
messages and the first message after them (the system prompt and the task); then
  1. it keeps a response the model sampled in a chain, and with it messages of that chain
     beyond its preamble that are not system messages (system messages anywhere, like a
     templated first request, are what an agent sends alike in every conversation) → a CM
     action of the chain that it keeps most of (the most recent on a tie). The chain's sampled
     responses found in the request by identity, in order, are aligned first, the messages
     between them by a diff of message hashes; then `truncate` (only removes, nothing of it
     resent elsewhere), `summarize` (replaces more than it adds, and the request is shorter
     than the conversation was), `rewrite` (anything else: edits, and reorders, messages
     removed from their place and resent elsewhere (not tool results, which repeat), listed in
     `info["moved"]`: aider moves its file block and canned reply after the history and strips
     its reminder from the last user message), or `preamble_change` (every message kept, in
     order, maybe with more after them, but another tool list: a framework's final call
     without its tools; nothing removed or added). But when both its
     system prompt (its leading system messages) and its tool list differ from the chain's, it
     is a *side chain*: a helper or sub-agent that copies the chain's history under its own
     preamble (Qwen Code's memory extractor), a new chain linked to the one it copied
     (`side_of`, the trajectory's `Turn.parent_chain`), no CM action of it;
  2. else it hands on the text of a chain's latest sampled response (at least
     MIN_HANDED_ON characters) inside a message that is not the assistant's, beyond the
     preamble: a summary the model wrote, resumed from (Codex CLI's second compaction puts
     "...the summary produced by the other language model: <it>" in a user message and
     reorders the rest) → a CM action of that chain (the most recent), classified as in 1;
  3. else it repeats the whole first request of a chain (its opening: system prompt, task and
     whatever else came before the first response), or of its latest segment, with the same
     tools as that request and goes on from there with new text (a summary after the task,
     the task's user messages kept by a compaction) → a CM action of that chain, classified as
     in 1 against its latest turn (Codex CLI asks for its summary without tools, so that call
     is the tip the resumed conversation is classified against);
  4. else, when both its system prompt and its tool list differ from a chain's and it copies
     assistant messages of that chain's history beyond the preamble (a client that resends
     the model's responses in its own words, so that rule 1 finds none by identity:
     smolagents' "Calling tools: [...]", copied by its plan-update call under a planning
     prompt without tools) → a side chain of the chain it copies most from (the most recent
     on a tie), no CM action;
  5. else it is a new conversation: a new chain, no CM action. A new conversation sharing a
     system prompt and templated messages (a second run of a CLI on another task), only a
     first user message, or nothing, is one.
What cannot be told apart: an agent that replaces both its own system prompt and its tool list
while keeping its history is recorded as a side chain of its old conversation (declare it with
`context_action` to record a `rewrite`); one that changes only one of them is a
`preamble_change` (tools) or a `rewrite` of message 0 (system prompt). A sampled response
handed on inside an assistant message of the client's own words is not matched by rule 2
(it reads only other roles: smolagents' action loop resends its latest plan that way, and
would be taken for a CM action of the planning call): smolagents' initial plan, asked alone
and handed to its action loop so, is recorded as a chain of its own and the loop as another.
By rule 4, a new conversation under a preamble of its own that repeats an assistant message of
another chain word for word (a canned few-shot answer both agents carry) is recorded as a side
chain of it: a link between chains, never a CM action.
Recorded as a new chain:
a `reset` (the conversation keeps
only its system prompt and goes on with a new user message: byte for byte a new conversation
of the same agent), and a summary that keeps nothing of the old conversation (a new first user
message holding a summary the model did not write as a chain's latest response: rule 2 finds
one it did). An agent that does either declares it (the SDK's
`context_action`, recorded on its next request). A request that repeats an earlier request
exactly is a retry (`fork`), and one that extends nothing is matched by rules 1-3, unless the
client says it starts a conversation of its own (`X-Envhub-Chain: new`, for harness authors
running one agent several times on a key; its requests still extend their own turns).
Chains are derived from what is stored (the parent turn, or the CM action's `from_seq`), so a
pool needs no extra column.
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field

from envhub.gateway.render.messages import chain
from envhub.sdk.types import CMAction, CMKind

Op = tuple[str, int, int, int, int]  # a difflib opcode: tag, old[i1:i2], new[j1:j2]
MIN_HANDED_ON = 16  # characters of a sampled response found in a later message (rule 2)


@dataclass
class TurnState:
    seq: int
    segment: int
    parent: TurnState | None  # state this turn's prompt extends (None: rendered in full)
    delta_ids: list[int]  # the turn's prompt_delta_ids
    completion_ids: list[int]
    appended_hashes: list[bytes]  # request messages after the parent's response
    response_hash: bytes
    tools_key: bytes
    response_text: str = ""  # the sampled completion's text (a summary handed on is matched)
    req_key: bytes = b""  # rolling hash of (tools, request messages)
    key: bytes = b""  # rolling hash of (tools, request messages, response)
    n_messages: int = 0  # request messages
    chain: int = -1  # the conversation: seq of its first turn (set by History.add)
    extended: bool = False  # a later turn of the same segment continued from here
    _ids: list[int] | None = None  # cached full history; kept only on segment tips

    def prompt_ids(self) -> list[int]:
        if self.parent is None or self.parent.segment != self.segment:
            return list(self.delta_ids)
        return self.parent.full_ids() + self.delta_ids

    def full_ids(self) -> list[int]:
        if self._ids is not None:
            return self._ids
        return self.prompt_ids() + self.completion_ids

    def conversation(self) -> tuple[list[bytes], set[int], int]:
        """The message hashes of the request and response of this turn (walks parents: only
        for requests that extend nothing), the positions of the sampled responses among them,
        and how many messages the first request of this path had (its opening)."""
        path: list[TurnState] = []
        node: TurnState | None = self
        while node is not None:
            path.append(node)
            node = node.parent
        hashes: list[bytes] = []
        responses: set[int] = set()
        for node in reversed(path):
            hashes += node.appended_hashes
            responses.add(len(hashes))
            hashes.append(node.response_hash)
        return hashes, responses, len(path[-1].appended_hashes)


@dataclass
class Plan:
    """How to build the prompt for a new request."""

    kind: str  # "extend" | "fork" | "retry" | "new" (rendered in full)
    parent: TurnState | None
    appended_from: int  # request messages [appended_from:] are rendered (all, for "new")
    appended_hashes: list[bytes]
    new_segment: bool
    action: CMAction | None = None
    declared: CMAction | None = None  # the agent's declaration this request took, as declared
    side_of: int | None = None  # a new chain that is a side call of this chain (rule 1)


@dataclass
class History:
    states: dict[int, TurnState] = field(default_factory=dict)
    by_key: dict[bytes, TurnState] = field(default_factory=dict)
    by_req: dict[bytes, TurnState] = field(default_factory=dict)
    next_seq: int = 0
    next_segment: int = 0
    latest: TurnState | None = None
    declared: CMAction | None = None  # declared by the agent, applies to the next request
    tips: dict[int, TurnState] = field(default_factory=dict)  # chain -> its latest turn
    side_of: dict[int, int] = field(default_factory=dict)  # side chain -> the chain it copied
    lease: str | None = None  # the pool lease it was loaded under (gateway/pool/leases.py)
    # the previous request's hashes and rolling hashes: agents resend the same prefix, so the
    # rolling hashes of that prefix are reused instead of recomputed (cost ∝ new messages)
    _last: tuple[list[bytes], list[bytes]] = (([], []))

    def _rolling(self, hashes: list[bytes], tools_key: bytes) -> list[bytes]:
        last_hashes, last_rolling = self._last
        n = len(last_hashes)
        if n and last_rolling[0] == tools_key and len(hashes) >= n and hashes[:n] == last_hashes:
            rolling = last_rolling[:]
        else:
            rolling, n = [tools_key], 0
        for h in hashes[n:]:
            rolling.append(chain(rolling[-1], h))
        self._last = (hashes, rolling)
        return rolling

    def plan(self, hashes: list[bytes], tools_key: bytes, role: Callable[[int], str],
             consume_declared: bool = True, new_chain: bool = False,
             text: Callable[[int], str] | None = None) -> Plan:
        """How a request with these message hashes relates to the history. `role(i)`: the role
        of its message i (asked only of a request that extends nothing). With
        `consume_declared=False` (a preview) the agent's declared action stays pending.
        `new_chain`: the client says this request starts a conversation of its own (it may
        extend its own turns, but is neither a retry nor a CM action of another). `text(i)`:
        the text of message i (rule 2 of the module docstring; asked like `role`)."""
        rolling = self._rolling(hashes, tools_key)
        plan = self._match(hashes, rolling, role, new_chain, text)
        if not consume_declared:
            return plan
        declared, self.declared = self.declared, None
        plan.declared = declared  # back with `release` when the call fails
        if declared is not None:
            info = {**declared.info, "detected": plan.action.kind if plan.action else None}
            from_seq = declared.from_seq
            if from_seq is None and plan.kind == "new" and self.latest is not None:
                # the agent says it managed its context: the conversation it left is its latest
                from_seq = plan.action.from_seq if plan.action is not None else self.latest.seq
            if plan.action is None and not plan.new_segment:
                info["history_extended"] = True  # recorded; the segment goes on
            plan.action = declared.model_copy(update={"info": info, "from_seq": from_seq})
        return plan

    def _match(self, hashes: list[bytes], rolling: list[bytes],
               role: Callable[[int], str], new_chain: bool,
               text: Callable[[int], str] | None = None) -> Plan:
        m = len(hashes)
        # Retry: the exact request of an earlier turn → same prompt ids, new segment.
        earlier = None if new_chain else self.by_req.get(rolling[m])
        if earlier is not None:
            return Plan("retry", earlier, m, earlier.appended_hashes, True,
                        CMAction(kind="fork", from_seq=earlier.seq,
                                 info={"reason": "retry of an earlier request"}))
        for i in range(m - 1, 0, -1):  # deepest state whose messages + response prefix these
            state = self.by_key.get(rolling[i])
            if state is None:
                continue
            if not state.extended:
                return Plan("extend", state, i, hashes[i:], False)
            return Plan("fork", state, i, hashes[i:], True,
                        CMAction(kind="fork", from_seq=state.seq,
                                 info={"reason": "continues an earlier turn"}))
        if new_chain:
            return Plan("new", None, 0, hashes, True)
        action, side_of = self._conversation_action(hashes, rolling[0], role, text)
        return Plan("new", None, 0, hashes, True, action, side_of=side_of)

    def _conversation_action(self, hashes: list[bytes], tools_key: bytes,
                             role: Callable[[int], str],
                             text: Callable[[int], str] | None = None
                             ) -> tuple[CMAction | None, int | None]:
        """The CM action of the conversation a request that extends nothing rewrites, or None
        when it starts a new conversation (rules 1-5 of the module docstring); and the chain
        it is a side call of (rules 1 and 4), if it is one."""
        n_system = 0
        while n_system < len(hashes) and role(n_system) == "system":
            n_system += 1
        preamble = min(n_system + 1, len(hashes))
        beyond = {j for j in range(preamble, len(hashes)) if role(j) != "system"}
        # a message resent elsewhere is a move, unless it is a tool result: those repeat
        # ("ok", "42") and carry no id in their hash
        movable = {j for j in range(len(hashes)) if role(j) != "tool"}
        kept_hashes = {hashes[j] for j in beyond}
        tips = [(tip, *tip.conversation())
                for tip in sorted(self.tips.values(), key=lambda s: s.seq, reverse=True)]
        best: tuple[int, CMAction, TurnState | None] | None = None
        for tip, old, responses, _ in tips:  # 1: keeps a sampled response of the chain
            if not any(old[i] in kept_hashes for i in responses):
                continue
            action, kept, kept_response = self._classify(old, hashes, beyond, responses, tip,
                                                         movable)
            if kept_response and (best is None or kept > best[0]):
                side = self._other_preamble(tip, old, hashes[:n_system], tools_key)
                best = (kept, action, tip if side else None)
        if best is not None:
            _, action, copied = best
            if copied is not None:  # another system prompt and tool list over its history
                return None, copied.chain
            return action, None
        if text is not None:  # 2: a chain's latest response handed on inside a message
            handed = [j for j in beyond if role(j) != "assistant"]
            for tip, old, responses, _ in tips:
                sampled = tip.response_text.strip()
                if len(sampled) >= MIN_HANDED_ON and any(sampled in text(j) for j in handed):
                    return self._classify(old, hashes, beyond, responses, tip, movable)[0], None
        for tip, old, responses, _ in tips:  # 3: the chain's own opening, then more
            if any(tools == tools_key and len(hashes) > len(first)
                   and hashes[:len(first)] == first for tools, first in self._openings(tip)):
                return self._classify(old, hashes, beyond, responses, tip, movable)[0], None
        # 4: a helper under its own preamble copying a chain's history whose responses the
        # client resends in its own words (smolagents' "Calling tools: [...]"): the assistant
        # messages it copies are the chain's
        said = {hashes[j] for j in beyond if role(j) == "assistant"}
        copies = [(len(said.intersection(old)), tip) for tip, old, _, _ in tips
                  if self._other_preamble(tip, old, hashes[:n_system], tools_key)]
        most = max((n for n, _ in copies), default=0)
        if most:
            return None, next(tip for n, tip in copies if n == most).chain
        return None, None

    def _other_preamble(self, tip: TurnState, old: list[bytes], system: list[bytes],
                        tools_key: bytes) -> bool:
        """A request's system prompt (`system`: its leading system messages' hashes) and tool
        list both differ from the chain's at `tip` (its conversation `old`): a side call."""
        return (system != old[:len(system)]
                and all(tools != tools_key for tools, _ in self._openings(tip))
                and tip.tools_key != tools_key)

    def _openings(self, tip: TurnState) -> list[tuple[bytes, list[bytes]]]:
        """(tools, messages) of the first requests a conversation can be repeated from: its
        chain's first request, and that of the segment path ending at `tip` (after a CM action,
        a compaction that kept the task and a summary). A compaction that asked for its summary
        under another tool list (Codex CLI: the history and a summary prompt, without tools)
        leaves that call as the chain's tip; the conversation it resumes is still the chain's."""
        root = tip
        while root.parent is not None:
            root = root.parent
        first = self.states.get(tip.chain)
        found = [(root.tools_key, root.appended_hashes)]
        if first is not None and first is not root:
            found.append((first.tools_key, first.appended_hashes))
        return found

    def _classify(self, old: list[bytes], new: list[bytes], beyond: set[int],
                  responses: set[int], ref: TurnState,
                  movable: set[int]) -> tuple[CMAction, int, bool]:
        """The action turning `ref`'s conversation (`old`: its messages and responses, the
        latter at `responses`) into `new`; how many of its messages `new` keeps at positions
        in `beyond` (past the preamble, not system messages), and whether one is a response.
        A message of `old` removed from its place and found again at a position of `new` in
        `movable` that the alignment left over was moved.

        The alignment is a diff of message hashes, unless it leaves out a response the request
        carries: then one anchored on what the gateway sampled (the chain's responses found in
        `new` by identity, in order, the messages between them diffed) when it keeps more of
        them (aider resends its file block and canned reply after the history: the plain diff
        lined those up instead of the reply and lost it)."""
        ops: list[Op] = list(difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes())
        if not self._keeps_every_response(ops, old, new, beyond, responses):
            anchored = self._anchored(old, new, beyond, responses)
            if (self._kept_responses(anchored, beyond, responses)
                    > self._kept_responses(ops, beyond, responses)):
                ops = anchored
        equal = [(i1, i2, j1) for tag, i1, i2, j1, _ in ops if tag == "equal"]
        removed = [[i1, i2] for tag, i1, i2, _, _ in ops if tag in ("delete", "replace")]
        added = [[j1, j2] for tag, i1, _, j1, j2 in ops
                 if tag == "replace" or (tag == "insert" and i1 < len(old))]
        kept = [(i1 + k, j1 + k) for i1, i2, j1 in equal for k in range(i2 - i1)
                if j1 + k in beyond]
        kept_response = any(i in responses for i, _ in kept)
        n_removed = sum(b - a for a, b in removed)
        n_added = sum(b - a for a, b in added)
        aligned = {j1 + k for i1, i2, j1 in equal for k in range(i2 - i1)}
        resent = {new[j] for j in range(len(new))
                  if j not in aligned and j in movable}
        moved: list[list[int]] = []  # removed where they were, resent at another place
        for i in (i for a, b in removed for i in range(a, b) if old[i] in resent):
            if moved and moved[-1][1] == i:
                moved[-1][1] = i + 1
            else:
                moved.append([i, i + 1])
        info = {"moved": moved} if moved else {}
        kind: CMKind
        if n_added == 0 and n_removed == 0:  # every message kept: only the tools changed
            kind = "preamble_change"
        elif n_added == 0 and not moved:
            kind = "truncate"
        elif n_removed > n_added and len(new) < len(old):  # and the conversation shrank
            kind = "summarize"
        else:
            kind = "rewrite"
        return CMAction(kind=kind, from_seq=ref.seq, removed=removed, added=added, info=info,
                        tokens_before=len(ref.full_ids())), len(kept), kept_response

    @staticmethod
    def _kept_responses(ops: list[Op], beyond: set[int],
                        responses: set[int]) -> int:
        return sum(1 for tag, i1, i2, j1, _ in ops if tag == "equal"
                   for k in range(i2 - i1) if i1 + k in responses and j1 + k in beyond)

    @staticmethod
    def _keeps_every_response(ops: list[Op], old: list[bytes], new: list[bytes],
                              beyond: set[int], responses: set[int]) -> bool:
        """Every response of `old` that `new` carries (past the preamble) is aligned by `ops`."""
        carried = {new[j] for j in beyond}
        return (History._kept_responses(ops, beyond, responses)
                >= sum(1 for i in responses if old[i] in carried))

    @staticmethod
    def _anchored(old: list[bytes], new: list[bytes], beyond: set[int],
                  responses: set[int]) -> list[Op]:
        """An alignment anchored on the responses of `old` found in `new` by identity, in
        order, with the messages between anchors aligned by `difflib`."""
        at: dict[bytes, list[int]] = {}
        for j in sorted(beyond):
            at.setdefault(new[j], []).append(j)
        anchors: list[tuple[int, int]] = []
        j0 = 0
        for i in sorted(responses):
            places = at.get(old[i], [])
            k = bisect.bisect_left(places, j0)
            if k < len(places):
                anchors.append((i, places[k]))
                j0 = places[k] + 1
        ops: list[Op] = []
        i_at = j_at = 0
        for i, j in [*anchors, (len(old), len(new))]:
            gap = difflib.SequenceMatcher(None, old[i_at:i], new[j_at:j], autojunk=False)
            ops += [(tag, a1 + i_at, a2 + i_at, b1 + j_at, b2 + j_at)
                    for tag, a1, a2, b1, b2 in gap.get_opcodes()]
            if i < len(old):
                ops.append(("equal", i, i + 1, j, j + 1))
            i_at, j_at = i + 1, j + 1
        return ops

    def chain_of(self, parent: TurnState | None, action: CMAction | None, seq: int) -> int:
        """The conversation of a new turn: its parent's, else that of the turn its CM action
        departed from, else a new one (its own seq)."""
        if parent is not None:
            return parent.chain
        if action is not None and action.from_seq is not None:
            origin = self.states.get(action.from_seq)
            if origin is not None:
                return origin.chain
        return seq

    def add(self, state: TurnState, request_key: bytes, n_messages: int,
            action: CMAction | None = None, side_of: int | None = None) -> None:
        """Register a finished turn (with the CM action it was recorded with, if any, and the
        chain it is a side call of, if it starts one) so later requests can extend it."""
        state.chain = self.chain_of(state.parent, action, state.seq)
        if side_of is not None and state.chain == state.seq and side_of in self.tips:
            self.side_of[state.chain] = side_of
        tip = self.tips.get(state.chain)
        if tip is None or state.seq > tip.seq:
            self.tips[state.chain] = state
        state.req_key = request_key
        state.key = chain(request_key, state.response_hash)
        state.n_messages = n_messages
        self.states[state.seq] = state
        self.by_key[state.key] = state
        self.by_req.setdefault(request_key, state)
        state._ids = state.prompt_ids() + state.completion_ids  # uses the parent's cache
        parent = state.parent
        if parent is not None and parent.segment == state.segment:
            parent._ids = None  # only segment tips keep their full history cached
        if self.latest is None or state.seq > self.latest.seq:
            self.latest = state

    def allocate(self, n: int, extends: TurnState | None) -> tuple[list[int], list[int]]:
        """(seqs, segments) for the `n` sampled turns of one request. With `extends` (the
        segment tip the prompt continues) the first turn stays in that segment and the tip is
        marked extended, so a later request continuing it again forks; every other turn starts
        a new segment. Undo the mark with `release` when the call fails (seqs are not reused)."""
        seqs = list(range(self.next_seq, self.next_seq + n))
        self.next_seq += n
        segments: list[int] = []
        for i in range(n):
            if i == 0 and extends is not None:
                segments.append(extends.segment)
                extends.extended = True
            else:
                segments.append(self.next_segment)
                self.next_segment += 1
        return seqs, segments

    def release(self, extends: TurnState | None, declared: CMAction | None = None) -> None:
        """A planned call failed: the tip it `allocate`d with (`extends`) may be extended
        again, and the declaration it took (`Plan.declared`) applies to the next request."""
        if extends is not None:
            extends.extended = False
        if declared is not None and self.declared is None:
            self.declared = declared

    def request_key(self, parent: TurnState | None, tools_key: bytes,
                    appended_hashes: list[bytes]) -> bytes:
        key = parent.key if parent is not None else tools_key
        for h in appended_hashes:
            key = chain(key, h)
        return key

