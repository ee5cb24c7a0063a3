"""Prefix-tree packing (issue 7, item 5).

Sequences that share a prefix (a group's prompt, the segments of one session) become one
token tree: a node per unique (prefix, token). Nodes are laid out in pre-order (DFS), so a
node's subtree is the contiguous range [i, end[i]). For the forward pass:
  position_ids[i] = depth of node i (positions restart per branch),
  i attends j  iff  j is an ancestor-or-self of i  iff  j <= i < end[j].
Each node then sees exactly the tokens it would see in its own unmerged sequence at the same
positions, so its hidden states and logits are mathematically those of the naive batch.
Per-sequence results are read back through `token_nodes` (the node of each token of each
sequence); a shared node is read once per sequence through it, so a shared trainable token
is weighted exactly as the naive batch weights it (once per sequence containing it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


class TokenTrie:
    """A trie of token sequences; `merge=False` keeps every sequence a separate branch."""

    def __init__(self, merge: bool = True) -> None:
        self.merge = merge
        self.tokens: list[int] = []
        self.parents: list[int] = []
        self.children: list[dict[int, int]] = []
        self.roots: dict[int, int] = {}
        self.root_order: list[int] = []
        self.paths: list[list[int]] = []  # node id of each token, per inserted sequence

    def __len__(self) -> int:
        return len(self.tokens)

    def new_nodes(self, seq: list[int]) -> int:
        """How many nodes inserting `seq` would add."""
        if not self.merge:
            return len(seq)
        level, depth = self.roots, 0
        for tok in seq:
            node = level.get(tok)
            if node is None:
                break
            level, depth = self.children[node], depth + 1
        return len(seq) - depth

    def insert(self, seq: list[int]) -> list[int]:
        path: list[int] = []
        parent = -1
        level = self.roots
        for tok in seq:
            node = level.get(tok) if self.merge else None
            if node is None:
                node = len(self.tokens)
                self.tokens.append(tok)
                self.parents.append(parent)
                self.children.append({})
                if parent < 0:
                    self.root_order.append(node)
                if self.merge:
                    level[tok] = node
                else:
                    # Unmerged: link the chain explicitly (the dict key cannot be the token).
                    level[-1 - len(self.tokens)] = node
            path.append(node)
            parent, level = node, self.children[node]
        self.paths.append(path)
        return path

    def preorder(self) -> list[int]:
        """Node ids in DFS pre-order (iterative: trees are thousands of tokens deep)."""
        order: list[int] = []
        stack = list(reversed(self.root_order))
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(reversed(list(self.children[node].values())))
        return order


@dataclass
class PackedTree:
    """One forward pass worth of tokens. Shapes: N = unique nodes, T_s = sequence length."""

    input_ids: torch.Tensor  # [N] int64, pre-order
    position_ids: torch.Tensor  # [N] int64, depth of each node
    subtree_end: torch.Tensor  # [N] int64, exclusive end of each node's subtree
    token_nodes: list[torch.Tensor]  # per sequence: [T_s] int64 packed index of each token

    @property
    def n_nodes(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def n_sequence_tokens(self) -> int:
        """Tokens the unmerged batch would process (sum of sequence lengths)."""
        return sum(int(t.shape[0]) for t in self.token_nodes)

    def allowed(self) -> torch.Tensor:
        """[N, N] bool: query i may attend key j (j ancestor-or-self of i)."""
        import torch

        idx = torch.arange(self.n_nodes)
        return (idx[None, :] <= idx[:, None]) & (idx[:, None] < self.subtree_end[None, :])

    def attention_bias(self, dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        """[1, 1, N, N] additive mask: 0 where allowed, the dtype's minimum elsewhere.

        Additive rather than boolean because eager attention adds the mask to the scores;
        SDPA accepts either. exp(min - max) underflows to exactly 0, so masked keys
        contribute nothing.
        """
        import torch

        bias = torch.zeros(self.n_nodes, self.n_nodes, dtype=dtype)
        bias.masked_fill_(~self.allowed(), torch.finfo(dtype).min)
        return bias.to(device)[None, None]


def pack(sequences: list[list[int]], merge: bool = True) -> PackedTree:
    """Pack sequences into one tree (merge=False: a forest of unshared chains)."""
    import torch

    trie = TokenTrie(merge)
    for seq in sequences:
        trie.insert(seq)
    order = trie.preorder()
    n = len(order)
    rank = [0] * n
    for i, node in enumerate(order):
        rank[node] = i
    depth = [0] * n
    for node in order:  # parents precede children in pre-order
        parent = trie.parents[node]
        depth[node] = 0 if parent < 0 else depth[parent] + 1
    size = [1] * n
    for node in reversed(order):
        parent = trie.parents[node]
        if parent >= 0:
            size[parent] += size[node]
    ids = torch.tensor([trie.tokens[node] for node in order], dtype=torch.long)
    pos = torch.tensor([depth[node] for node in order], dtype=torch.long)
    end = torch.tensor([rank[node] + size[node] for node in order], dtype=torch.long)
    nodes = [torch.tensor([rank[x] for x in path], dtype=torch.long) for path in trie.paths]
    return PackedTree(ids, pos, end, nodes)


def plan_trees(sequences: list[list[int]], max_nodes: int, merge: bool = True) -> list[list[int]]:
    """Split sequence indices into consecutive bins whose packed trees stay under `max_nodes`.

    Greedy in the given order (keep a group's sequences adjacent so they share a tree); a
    sequence longer than the budget gets a bin of its own.
    """
    bins: list[list[int]] = []
    trie = TokenTrie(merge)
    for i, seq in enumerate(sequences):
        if bins and len(trie) + trie.new_nodes(seq) > max_nodes:
            trie = TokenTrie(merge)
            bins.append([])
        if not bins:
            bins.append([])
        trie.insert(seq)
        bins[-1].append(i)
    return bins
