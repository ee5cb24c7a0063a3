"""Tree attention through FlexAttention (trainer/flex_tree.py) and the mode selector.

On the CPU flex has a forward but no backward (torch 2.13), so these tests check the block
mask and the forward (fp32, eager); the backward and the compiled kernel are checked by
bench/bench_prefix_tree.py on a CUDA machine, not by skipped tests here.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from envhub.trainer import flex_tree, tree_attention
from envhub.trainer.batch import TrainSequence
from envhub.trainer.config import TrainerConfig
from envhub.trainer.errors import TrainerError
from envhub.trainer.forward import tree_logprobs
from envhub.trainer.prefix_tree import pack
from envhub.trainer.synthetic import RolloutShape, sample_group
from envhub.trainer.trainer import Trainer
from tests.trainer.models import tiny_model

# Eager flex on the CPU warns that it is unfused; that is the point of running it here.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _branchy_tree() -> Any:
    """A 40-token trunk with four 150-token branches (640 nodes, 5 x 5 flex blocks), one of
    which forks again after 20 tokens: windows, forks and empty blocks all occur."""
    trunk = list(range(40))
    seqs = [trunk + [100 + b] * 150 for b in range(4)]
    seqs.append(trunk + [100] * 20 + [7] * 30)
    return pack(seqs)


@pytest.mark.parametrize("window", [None, 16, 3])
def test_block_mask_is_the_ancestor_mask(window: int | None) -> None:
    from torch.nn.attention.flex_attention import create_mask

    tree = _branchy_tree()
    n = tree.n_nodes
    carrier = tree_attention.tree_mask(tree.subtree_end, tree.position_ids, torch.float32,
                                       "flex")
    layout = carrier._envhub_tree
    idx = torch.arange(n)
    want = tree_attention._allowed(layout, idx, idx, window)  # [N, N]
    if window is None:
        assert torch.equal(want, tree.allowed())
    mask_mod = flex_tree.tree_mask_mod(layout.end, layout.depth, window)
    assert torch.equal(create_mask(mask_mod, None, None, n, n, device="cpu")[0, 0], want)
    bm = flex_tree.block_mask(layout, window)
    assert flex_tree.block_mask(layout, window) is bm  # built once, shared by every layer
    # Block level: a (query block, key block) is visited iff some pair in it is allowed.
    nb = -(-n // flex_tree.FLEX_BLOCK)
    pad = torch.zeros(nb * flex_tree.FLEX_BLOCK, nb * flex_tree.FLEX_BLOCK, dtype=torch.bool)
    pad[:n, :n] = want
    blocks = pad.view(nb, flex_tree.FLEX_BLOCK, nb, flex_tree.FLEX_BLOCK).any(3).any(1)
    assert torch.equal(bm.to_dense()[0, 0].bool(), blocks)
    assert not blocks.all()  # sibling branches skip each other's blocks


def _naive_logprobs(model: Any, seqs: list[list[int]]) -> torch.Tensor:
    """Each sequence alone through the model's own forward: log p of tokens 1..T-1."""
    out = []
    for seq in seqs:
        logits = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0]
        out.append(torch.log_softmax(logits[:-1], -1)[torch.arange(len(seq) - 1),
                                                      torch.tensor(seq[1:])])
    return torch.cat(out)


@pytest.mark.parametrize("arch", ["qwen2", "llama", "mistral", "gemma2"])
def test_flex_tree_forward_equals_naive(arch: str) -> None:
    """fp32, eager flex on the CPU: Mistral slides a 16-token window on every layer, Gemma-2
    soft-caps at 5 and slides on layer 0 (test_prefix_tree checks these features bite)."""
    model = tiny_model(arch)
    traj = sample_group(model, "g", RolloutShape(sessions=4, turns=4, prompt_len=20), seed=2)
    seqs = [s.token_ids for t in traj for s in t.segments]
    tree = pack(seqs)
    assert tree.n_nodes < tree.n_sequence_tokens and max(map(len, seqs)) > 2 * 16
    with torch.no_grad():
        out = tree_logprobs(model, tree, attention="flex")
        naive = _naive_logprobs(model, seqs)
        unmerged = tree_logprobs(model, pack(seqs, merge=False), attention="flex")
    assert out.attention == "flex"
    assert (out.logprobs - naive).abs().max().item() <= 1e-5
    assert (unmerged.logprobs - naive).abs().max().item() <= 1e-5


def test_selector_rule() -> None:
    choose = tree_attention.choose_attention
    assert choose("auto", "cpu", 64, 0.0, 100) == "blocks"
    assert choose("auto", "cpu", 64, 0.0, 10**6, flex=True) == "blocks"
    assert choose("auto", "cuda", 64, 0.0, 20480, flex=True) == "flex"
    assert choose("auto", "cuda", 8, 0.0, 4096, flex=True) == "dense"  # head dim < 16
    assert choose("auto", "cuda", 64, 0.1, 4096, flex=True) == "dense"  # dropout trains
    assert choose("auto", "cuda", 64, 0.0, 20480, flex=False) == "blocks"  # no flex, big N
    for mode in tree_attention.MODES:
        assert choose(mode, "cpu", 8, 0.5, 10**6, flex=False) == mode  # asked: as asked
    assert not tree_attention.worth_merging(109, 100, "cuda")
    assert tree_attention.worth_merging(110, 100, "cuda")
    assert tree_attention.worth_merging(101, 100, "cpu")  # the CPU tree always merges


def test_config_option_and_deprecated_alias() -> None:
    assert TrainerConfig().attention_mode == "auto"
    assert TrainerConfig(tree_attention="flex").attention_mode == "flex"
    assert TrainerConfig(sparse_attention=False).attention_mode == "dense"
    assert TrainerConfig(sparse_attention=True, tree_attention="dense").attention_mode == "blocks"


def _sequences(seqs: list[list[int]]) -> list[TrainSequence]:
    return [TrainSequence(f"s{i}", "g", 0, s, [0] + [1] * (len(s) - 1), [-1.0] * len(s),
                          [1.0 if i % 2 else -1.0] * len(s)) for i, s in enumerate(seqs)]


@pytest.mark.parametrize("shared, merged", [(4, True), (0, False)])
def test_trainer_reports_the_path_it_ran(shared: int, merged: bool) -> None:
    """8 sequences of `shared` common + 40 own tokens: bound 1.07 still merges on the CPU
    (on CUDA "auto" would not: test_selector_rule); nothing shared packs one chain per
    sequence. The step metrics say which mode ran and whether it merged."""
    trainer = Trainer(tiny_model("llama"), TrainerConfig(optim={"lr": 1e-4}))
    g = torch.Generator().manual_seed(0)
    trunk = torch.randint(0, 512, (shared,), generator=g).tolist()
    seqs = [trunk + torch.randint(0, 512, (40,), generator=g).tolist() for _ in range(8)]
    m = trainer.train_sequences(_sequences(seqs))
    assert m["tree/merged"] + m["tree/unmerged"] == 1
    assert m["attention/blocks"] == 1 and m["attention/flex"] == m["attention/dense"] == 0
    assert (m["tokens/packed"] < m["tokens/naive"]) == merged
    unmerged = Trainer(tiny_model("llama"), TrainerConfig(prefix_merge=False))
    assert unmerged.train_sequences(_sequences(seqs))["tree/unmerged"] == 1


def test_flex_refuses_attention_dropout_in_training() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, attention_dropout=0.1)).train()
    tree = pack([[1, 2, 3, 4], [1, 2, 5]])
    with pytest.raises(TrainerError, match="no attention dropout .*tree_attention='blocks'"):
        tree_logprobs(model, tree, attention="flex")
    out = tree_logprobs(model, tree)  # auto on the CPU: blocks, exact with dropout
    assert out.attention == "blocks"
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert tree_logprobs(model.eval(), tree, attention="flex").attention == "flex"


def test_flex_refuses_gradients_on_the_cpu() -> None:
    """torch has no flex backward on the CPU: a Trainer asked for flex there is refused when
    it is built, and a forward with gradients before it runs."""
    with pytest.raises(TrainerError, match="trains on CUDA only.*no backward on cpu"):
        Trainer(tiny_model("qwen2"), TrainerConfig(tree_attention="flex"))
    model = tiny_model("qwen2")
    with pytest.raises(TrainerError, match="no backward on cpu .*tree_attention='blocks'"):
        tree_logprobs(model, pack([[1, 2, 3, 4, 5], [1, 2, 3, 6, 7]]), attention="flex")


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(TrainerError, match="use one of blocks, dense, flex"):
        tree_logprobs(tiny_model("qwen2"), pack([[1, 2, 3]]), attention="sparse")
