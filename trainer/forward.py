"""Forward pass of a packed tree through a transformers causal LM.

The model gets explicit position_ids (node depths) and a 4D placeholder `attention_mask`
carrying the tree: transformers (v4.45+ and v5) returns a 4D mask from its mask builder
as-is, so it reaches every layer's attention function, `tree_attention` (tree_attention.py),
which applies the tree with that layer's own window and soft-cap. Only the nodes that
predict a loss token go through the LM head (`logits_to_keep` with an index tensor), which
keeps the [nodes, vocab] logits small.

The decoder + chunked LM head run as one method of the causal LM (`bind_tree_forward`), so
under FSDP2 it is registered as a root forward (distributed.py) and the root's parameters
(embeddings, final norm, LM head) are gathered around it. A PEFT model is run through its
causal LM (the LoRA layers are injected there).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from types import MethodType
from typing import TYPE_CHECKING, Any

from envhub.trainer.attention_features import text_config
from envhub.trainer.prefix_tree import PackedTree

if TYPE_CHECKING:
    import torch


@dataclass
class TokenLogprobs:
    """Flat over the selected target tokens of all sequences of a tree (M tokens)."""

    logprobs: torch.Tensor  # [M] fp32, differentiable: log pi_theta(token | prefix)
    entropy: torch.Tensor  # [M] fp32, detached: entropy of the predicting distribution
    seq_index: torch.Tensor  # [M] int64: which sequence of the tree each token belongs to
    token_index: torch.Tensor  # [M] int64: position of the token in its sequence
    attention: str = "blocks"  # the tree-attention mode that ran (tree_attention.MODES)


def select_targets(tree: PackedTree, loss_masks: list[list[int]] | None) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(sequence index, token position, predicting node, target token id), [M] each.

    Targets are tokens 1..T-1 of each sequence (token 0 has nothing to be predicted from);
    with `loss_masks` only tokens whose mask is 1.
    """
    import torch

    seqs, toks, preds = [], [], []
    for s, nodes in enumerate(tree.token_nodes):
        t = torch.arange(1, nodes.shape[0])
        if loss_masks is not None:
            t = t[torch.tensor(loss_masks[s][1:], dtype=torch.bool)]
        seqs.append(torch.full_like(t, s))
        toks.append(t)
        preds.append(nodes[t - 1])
    targets = [tree.input_ids[nodes[t]] for nodes, t in zip(tree.token_nodes, toks, strict=True)]
    return torch.cat(seqs), torch.cat(toks), torch.cat(preds), torch.cat(targets)


# Logit elements per LM-head chunk (128M fp32 = 512 MB): a 151k vocabulary and thousands of
# loss tokens would otherwise materialise several GB of logits (and as much again for grads).
HEAD_CHUNK_ELEMENTS = 1 << 27


def tree_logprobs(model: Any, tree: PackedTree, loss_masks: list[list[int]] | None = None,
                  *, with_entropy: bool = True, chunked_head: bool | None = None,
                  attention: str = "auto", sparse_attention: bool | None = None,
                  compute_dtype: torch.dtype | None = None) -> TokenLogprobs:
    """Run `model` once on the tree; return log-probabilities of the target tokens.

    `chunked_head` (default: when the model allows it) applies the LM head in checkpointed
    chunks; otherwise the model's own forward computes logits for the predicting nodes.
    `attention` is the tree-attention mode ("auto", "flex", "blocks", "dense"; "auto" picks by
    device, head dim, dropout and size: `tree_attention.choose_attention`); the mode that ran
    is returned in `attention`. `sparse_attention` is its deprecated spelling (True: blocks,
    False: dense) and wins when given. Every mode routes the model's attention through
    `tree_attention` for good (`use_tree_attention`: refuses models whose attention the tree
    cannot keep exact), so a backward with gradient checkpointing recomputes the same
    attention, on the same masks (built once per call, cached per window). `compute_dtype`
    is the dtype the layers compute in when it differs from the parameters' (FSDP2 mixed
    precision): the tree placeholder is made in it, so FSDP2's input cast leaves it alone.
    """
    import torch

    from envhub.trainer.distributed import TREE_FORWARD, causal_lm
    from envhub.trainer.tree_attention import choose_attention, tree_mask, use_tree_attention

    model = causal_lm(model)
    use_tree_attention(model)
    param = next(model.parameters())
    device, dtype = param.device, compute_dtype or param.dtype
    seq_index, token_index, pred_nodes, targets = select_targets(tree, loss_masks)
    if sparse_attention is not None:
        attention = "blocks" if sparse_attention else "dense"
    attention = choose_attention(attention, device.type, _head_dim(model), _dropout(model),
                                 tree.n_nodes)
    mask = tree_mask(tree.subtree_end.to(device), tree.position_ids.to(device), dtype,
                     attention)
    inputs = {"input_ids": tree.input_ids[None].to(device),
              "position_ids": tree.position_ids[None].to(device),
              "attention_mask": mask, "use_cache": False}
    pred_nodes, targets = pred_nodes.to(device), targets.to(device)
    if chunked_head is None:
        chunked_head = _plain_head(model)
    if chunked_head:
        run = getattr(model, TREE_FORWARD, None) or partial(_decoder_and_head, model)
        logprobs, entropy = run(inputs, pred_nodes, targets, with_entropy)
        return TokenLogprobs(logprobs, entropy, seq_index, token_index, attention)
    # Any other causal LM: let it apply its own head (softcapping, scaling) on the kept rows.
    keep, inverse = torch.unique(pred_nodes, return_inverse=True)  # sorted unique nodes
    logits = model(**inputs, logits_to_keep=keep).logits[0]  # [K, V]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # log-softmax in at least fp32 (fp64 models stay fp64)
    logsm = torch.log_softmax(logits, dim=-1)
    logprobs = logsm[inverse, targets]
    entropy = torch.zeros_like(logprobs).detach()
    if with_entropy:
        with torch.no_grad():
            entropy = (-(logsm.exp() * logsm).sum(-1))[inverse]
    return TokenLogprobs(logprobs, entropy, seq_index, token_index, attention)


def _head_dim(model: Any) -> int:
    cfg = text_config(model)
    head_dim = getattr(cfg, "head_dim", None)
    return int(head_dim or cfg.hidden_size // cfg.num_attention_heads)


def _dropout(model: Any) -> float:
    """Attention dropout the layers apply now (only in training mode)."""
    p = getattr(text_config(model), "attention_dropout", 0.0) or 0.0
    return float(p) if getattr(model, "training", False) else 0.0


def bind_tree_forward(model: Any) -> None:
    """Give the causal LM `model` the decoder + chunked head as a method (TREE_FORWARD), for
    FSDP2's `register_fsdp_forward_method`."""
    from envhub.trainer.distributed import TREE_FORWARD

    setattr(model, TREE_FORWARD, MethodType(_decoder_and_head, model))


def _decoder_and_head(model: Any, inputs: dict[str, Any], pred_nodes: torch.Tensor,
                      targets: torch.Tensor, with_entropy: bool
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    hidden = model.model(**inputs).last_hidden_state[0]  # [N, H]
    return _chunked_head(model.lm_head, hidden[pred_nodes], targets, with_entropy)


def _plain_head(model: Any) -> bool:
    """A decoder `model.model` + linear `model.lm_head` and nothing applied in between."""
    cfg = getattr(model, "config", None)
    return (hasattr(model, "model") and hasattr(model, "lm_head")
            and getattr(cfg, "final_logit_softcapping", None) is None
            and getattr(cfg, "logit_scale", None) is None)


def _chunked_head(head: Any, hidden: torch.Tensor, targets: torch.Tensor,
                  with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """log p(target) and entropy for rows of `hidden` ([M, H]), LM head applied in chunks.

    Each chunk runs under activation checkpointing, so only one chunk of logits is alive at
    a time, in the forward and in the backward.
    """
    import torch
    from torch.utils.checkpoint import checkpoint

    def piece(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = head(h)
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        lse = torch.logsumexp(logits, dim=-1)
        lp = logits.gather(1, t[:, None])[:, 0] - lse
        ent = torch.zeros_like(lse)
        if with_entropy:
            with torch.no_grad():
                ent = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
        return lp, ent.detach()

    rows = max(1, HEAD_CHUNK_ELEMENTS // int(head.weight.shape[0]))
    if hidden.shape[0] <= rows:
        return piece(hidden, targets)  # one chunk: keep its logits, skip the recompute
    lps, ents = [], []
    for i in range(0, hidden.shape[0], rows):
        lp, ent = checkpoint(piece, hidden[i:i + rows], targets[i:i + rows],
                             use_reentrant=False)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(0)
        return empty, empty
    return torch.cat(lps), torch.cat(ents)
