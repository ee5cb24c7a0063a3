"""A trajectory as the session page shows it: turns of decoded tokens (prompt vs sampled, with
logprobs and weight versions), context-management actions at the segment breaks they caused,
tool calls, signals and reward-to-go per turn."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from envhub.sdk.types import CMAction, Signal, ToolCall, Trajectory
from envhub.viewer.tokens import TokenDecoder


@dataclass
class TokenSpan:
    text: str
    title: str  # the hover text: id, logprob, probability, weight version
    cls: str  # "p" prompt, "s" sampled, plus " sp" for special tokens
    shade: float = 0.0  # 0..1: 1 - probability of a sampled token (unlikely = darker)


@dataclass
class TurnBlock:
    seq: int
    segment: int
    weight_version: int
    finish_reason: str
    latency_ms: float
    trainable: bool
    instance: str
    prompt: list[TokenSpan]
    sampled: list[TokenSpan]
    completion_text: str | None  # text-only backends record text, not ids
    tool_calls: list[ToolCall]
    chain: int = 0
    breaks: list[CMAction] = field(default_factory=list)  # actions that started this segment
    new_segment: bool = False
    signals: list[Signal] = field(default_factory=list)
    reward_to_go: float | None = None
    mean_logprob: float | None = None


def _prompt_spans(decoder: TokenDecoder, ids: list[int]) -> list[TokenSpan]:
    return [TokenSpan(p.text, f"prompt · id {p.id}", "p sp" if p.special else "p")
            for p in decoder.pieces(ids)]


def _sampled_spans(decoder: TokenDecoder, ids: list[int], logprobs: list[float],
                   version: int) -> list[TokenSpan]:
    spans = []
    for p, lp in zip(decoder.pieces(ids), logprobs, strict=False):
        prob = math.exp(lp) if lp <= 0 else 1.0
        title = f"sampled · id {p.id} · logprob {lp:.3f} · p {prob:.3f} · weights v{version}"
        spans.append(TokenSpan(p.text, title, "s sp" if p.special else "s", 1.0 - prob))
    return spans


def turn_blocks(traj: Trajectory, decoder: TokenDecoder) -> tuple[list[TurnBlock],
                                                                  list[CMAction]]:
    """The turns in order, and the CM actions not tied to any recorded turn (declared by an
    agent that made no call after them)."""
    by_seq: dict[int, list[CMAction]] = {}
    loose: list[CMAction] = []
    for action in traj.cm_actions:
        if action.seq is None:
            loose.append(action)
        else:
            by_seq.setdefault(action.seq, []).append(action)
    rtg = {e.seq: e.value for e in traj.rewards if e.kind == "reward_to_go" and e.seq is not None}
    signals: dict[int | None, list[Signal]] = {}
    for s in traj.signals:
        signals.setdefault(s.seq, []).append(s)
    blocks, segment = [], None
    for turn in traj.turns:
        lps = turn.completion_logprobs
        blocks.append(TurnBlock(
            seq=turn.seq, segment=turn.segment, weight_version=turn.weight_version,
            finish_reason=turn.finish_reason, latency_ms=turn.latency_ms,
            trainable=turn.trainable, instance=turn.instance, chain=turn.chain,
            prompt=_prompt_spans(decoder, turn.prompt_delta_ids),
            sampled=_sampled_spans(decoder, turn.completion_ids, lps, turn.weight_version),
            completion_text=turn.completion_text if not turn.completion_ids else None,
            tool_calls=turn.tool_calls, breaks=by_seq.pop(turn.seq, []),
            new_segment=segment is not None and turn.segment != segment,
            signals=signals.get(turn.seq, []), reward_to_go=rtg.get(turn.seq),
            mean_logprob=sum(lps) / len(lps) if lps else None))
        segment = turn.segment
    # actions whose turn is missing from the record (e.g. a pool cut mid-write) stay visible
    loose += [a for actions in by_seq.values() for a in actions]
    return blocks, loose


@dataclass
class ChainNode:
    """A conversation of the session (gateway/history.py): its turns, segments and CM actions,
    and the side chains that copied its history (a helper or sub-agent call)."""

    chain: int
    parent: int | None
    turns: list[int] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)
    actions: list[CMAction] = field(default_factory=list)
    children: list[ChainNode] = field(default_factory=list)
    main: bool = False


def chain_tree(traj: Trajectory) -> list[ChainNode]:
    """The session's chains as a tree: root chains (the main one marked) in order of their first
    turn, each with its side chains under it."""
    nodes: dict[int, ChainNode] = {}
    chain_of: dict[int, int] = {}
    for turn in traj.turns:
        node = nodes.setdefault(turn.chain, ChainNode(turn.chain, turn.parent_chain))
        node.turns.append(turn.seq)
        if turn.segment not in node.segments:
            node.segments.append(turn.segment)
        chain_of[turn.seq] = turn.chain
    for action in traj.cm_actions:
        if action.seq is not None and action.seq in chain_of:
            nodes[chain_of[action.seq]].actions.append(action)
    main = traj.main_chain()
    roots: list[ChainNode] = []
    for node in sorted(nodes.values(), key=lambda n: n.chain):
        node.main = node.chain == main
        parent = nodes.get(node.parent) if node.parent is not None else None
        (parent.children if parent is not None else roots).append(node)
    return roots
