"""Tree attention as installed on a model: gradient checkpointing recomputes the same
attention, plain forwards are untouched, and models whose attention the tree cannot keep
exact are refused loudly before training."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from envhub.trainer.attention_features import UnsupportedAttention
from envhub.trainer.config import TrainerConfig
from envhub.trainer.distributed import activation_checkpointing, set_activation_checkpointing
from envhub.trainer.errors import TrainerError
from envhub.trainer.forward import tree_logprobs
from envhub.trainer.prefix_tree import pack
from envhub.trainer.synthetic import RolloutShape, sample_group
from envhub.trainer.trainer import Trainer
from envhub.trainer.tree_attention import restore_attention, use_tree_attention
from tests.trainer.models import tiny_model


def _tree_grads(model: Any, sparse: bool, checkpointing: bool) -> tuple[torch.Tensor, dict]:
    traj = sample_group(model, "g", RolloutShape(sessions=4, turns=4, prompt_len=20), seed=2)
    seqs = [s.token_ids for t in traj for s in t.segments]
    set_activation_checkpointing(model, checkpointing)
    model.train()  # checkpointing only acts in training mode; the test models have no dropout
    model.zero_grad(set_to_none=True)
    out = tree_logprobs(model, pack(seqs), sparse_attention=sparse)
    (out.logprobs * torch.linspace(-1, 1, out.logprobs.numel())).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logprobs.detach(), grads


@pytest.mark.parametrize("arch, sparse", [("qwen2", True), ("qwen2", False),
                                          ("gemma2", True), ("gemma2", False)])
def test_gradient_checkpointing_gives_the_same_gradients(arch: str, sparse: bool) -> None:
    """The recompute in backward runs the same tree attention (it used to crash: the
    attention override was switched off before backward)."""
    model = tiny_model(arch)
    lp_plain, g_plain = _tree_grads(model, sparse, checkpointing=False)
    lp_ckpt, g_ckpt = _tree_grads(model, sparse, checkpointing=True)
    assert activation_checkpointing(model)
    assert torch.allclose(lp_plain, lp_ckpt, atol=1e-6)
    assert g_plain.keys() == g_ckpt.keys() and len(g_plain) > 10
    for name, g in g_plain.items():
        assert (g - g_ckpt[name]).abs().max().item() <= 1e-5, name
    assert max(g.abs().max().item() for g in g_plain.values()) > 1e-3


def test_trainer_applies_gradient_checkpointing() -> None:
    model = tiny_model("llama")
    Trainer(model, TrainerConfig(gradient_checkpointing=True))
    assert activation_checkpointing(model)
    assert model.config._attn_implementation == "envhub_tree/sdpa"


def test_plain_forwards_are_unchanged_and_restore_undoes_the_install() -> None:
    model = tiny_model("mistral")  # its plain mask slides a window: built as sdpa builds it
    seq = torch.randint(0, 512, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=seq).logits
        use_tree_attention(model)
        use_tree_attention(model)  # idempotent: no envhub_tree/envhub_tree/...
        assert model.config._attn_implementation == "envhub_tree/sdpa"
        during = model(input_ids=seq).logits
        restore_attention(model)
        assert model.config._attn_implementation == "sdpa"
    assert torch.equal(before, during)


def _llama_with(**extra: Any) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, **extra)
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("extra, feature", [
    ({"attention_chunk_size": 8}, "chunked attention"),
    ({"alibi": True}, "ALiBi"),
    ({"use_bidirectional_attention": True}, "bidirectional attention"),
    ({"layer_types": ["full_attention", "linear_attention"]}, "'linear_attention'"),
])
def test_refuses_config_features_before_training(extra: dict, feature: str) -> None:
    model = _llama_with(**extra)
    with pytest.raises(UnsupportedAttention, match=feature) as err:
        Trainer(model)
    assert str(err.value).startswith("llama: ")  # names the model type
    assert isinstance(err.value, TrainerError)


def test_refuses_attention_sinks_from_gpt_oss() -> None:
    """gpt-oss adds a learned sink logit per head (`s_aux`); refused from its parameters."""
    from transformers import GptOssConfig, GptOssForCausalLM

    cfg = GptOssConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                       num_local_experts=2, num_experts_per_tok=1, sliding_window=8)
    with pytest.raises(UnsupportedAttention, match="gpt_oss: attention sinks"):
        Trainer(GptOssForCausalLM(cfg))


def test_refuses_unexpected_attention_arguments_in_the_probe_forward() -> None:
    """A layer passing an argument the tree path does not implement (here a sink logit, as
    gpt-oss's attention does) is refused by the probe forward the Trainer runs at build."""
    model = _llama_with()
    attn_cls = type(model.model.layers[0].self_attn)
    forward = attn_cls.forward

    def with_sinks(self: Any, *args: Any, **kwargs: Any) -> Any:
        return forward(self, *args, s_aux=torch.zeros(2), **kwargs)

    for layer in model.model.layers:  # this model instance only, not the class
        layer.self_attn.forward = with_sinks.__get__(layer.self_attn)
    with pytest.raises(UnsupportedAttention, match=r"llama: attention sinks \(s_aux\)"):
        Trainer(model)
