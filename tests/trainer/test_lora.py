"""LoRA through PEFT: only the adapters train, and the push hands a real `envhub engine` merged
full weights that it loads and samples exactly what the trained adapter model computes."""

from __future__ import annotations

import pytest
import torch

from envhub.trainer.config import LoraSettings, OptimConfig, TrainerConfig
from envhub.trainer.errors import TrainerError
from envhub.trainer.source import Group
from envhub.trainer.synthetic import RolloutShape, sample_group
from envhub.trainer.trainer import Trainer
from envhub.trainer.weights import http_pusher
from tests.trainer.models import TINY, tiny_model

pytest.importorskip("peft")


def _config(**lora) -> TrainerConfig:
    return TrainerConfig(optim=OptimConfig(lr=1e-2, adam_eps=1e-4),
                         lora=LoraSettings(rank=4, alpha=8, **lora))


def test_lora_push_sends_merged_weights_the_engine_loads(tmp_path) -> None:
    import httpx
    from transformers import AutoModelForCausalLM

    from envhub.gateway.engine.process import EngineProcess

    model = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = Trainer(model, _config())
    assert trainer.params and all(p.requires_grad for p in trainer.params)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    sampler = AutoModelForCausalLM.from_pretrained(TINY, dtype=torch.float32)
    shape = RolloutShape(sessions=2, turns=2, prompt_len=8)
    for step in range(2):  # LoRA's B starts at 0: the 2nd step moves the model's outputs
        trainer.step([Group(f"g{step}", sample_group(sampler, f"g{step}", shape, seed=step))])

    def assert_base_unchanged() -> None:
        for name, p in trainer.model.get_base_model().named_parameters():
            if "lora_" not in name:  # frozen base weights did not move
                assert torch.equal(p, base[name.replace(".base_layer", "")]), name

    assert_base_unchanged()
    prompt = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 0, "return_token_ids": True,
            "logprobs": 1}
    with EngineProcess(["--threads", "1"], log_path=tmp_path / "engine.log") as engine:
        path = trainer.sync(tmp_path / "weights",
                            http_pusher(f"{engine.url}/update_weights_from_disk"))
        after = httpx.post(engine.url + "/v1/completions", json=body, timeout=120).json()
    assert after["weight_version"] == 1
    assert_base_unchanged()  # merging for the push left the trained model alone
    assert path is not None and not list(path.glob("adapter_*"))  # a full folder, no adapter
    merged, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                        output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    adapted = trainer.model.eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        want = adapted(ids).logits
        got = merged(ids).logits
        plain = sampler(ids).logits
    assert (want - plain).abs().max() > 1e-4  # the adapters changed the model
    assert (want - got).abs().max() < 1e-4  # and the pushed weights are the adapted model
    with torch.no_grad():  # greedy decode with the adapter model
        seq = list(prompt)
        for _ in range(6):
            seq.append(int(adapted(torch.tensor([seq])).logits[0, -1].argmax()))
    assert after["choices"][0]["token_ids"] == seq[len(prompt):]


def test_lora_with_unknown_targets_is_a_clear_error() -> None:
    with pytest.raises(TrainerError, match="lora.targets"):
        Trainer(tiny_model("qwen2"), _config(targets=["no_such_proj"]))
