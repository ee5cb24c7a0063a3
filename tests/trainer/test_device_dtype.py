"""Where the trainer computes and in what dtype (issue 28): `--device` and `--dtype` on `envhub
train`, checked like any flag, and `--device cpu` keeping the trainer, its optimizer and the
embedded engine off CUDA (no CUDA context is ever created, also on a machine that has a GPU)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from envhub.cli import app
from envhub.orchestrator.training.config import TrainLoopConfig
from envhub.sdk.device import DeviceUnavailable, auto_dtype, check_device, resolve_device
from envhub.trainer.config import TrainerConfig

pytest.importorskip("torch")

runner = CliRunner()
ACCEPTED = "auto, cpu, cuda, cuda:N"


def test_device_names_are_checked_once_for_every_component() -> None:
    assert [check_device(d) for d in ("auto", " CPU", "cuda", "cuda:3", "mps")] == [
        "auto", "cpu", "cuda", "cuda:3", "mps"]
    for bad in ("gpu", "cuda:", "cuda:x", "cpu:0", ""):
        with pytest.raises(ValueError, match=ACCEPTED):
            check_device(bad)
    assert resolve_device("cpu").type == "cpu"
    with pytest.raises(DeviceUnavailable, match="--device cpu"):
        resolve_device("cuda:99")  # no machine this runs on has 100 GPUs
    assert auto_dtype("auto", "cuda") == "bfloat16" and auto_dtype("auto", "cpu") == "float32"
    assert auto_dtype("float16", "cpu") == "float16"


def test_trainer_config_device_and_dtype_spellings() -> None:
    assert TrainerConfig().device is None and TrainerConfig().precision == "fp32"
    assert TrainerConfig(device="CUDA:1").device == "cuda:1"
    assert TrainerConfig(precision="bfloat16").precision == "bf16"  # the engine's name
    with pytest.raises(ValidationError, match=ACCEPTED):
        TrainerConfig(device="gpu")


def test_train_loop_defaults_keep_rollouts_in_the_trainers_precision() -> None:
    cfg = TrainLoopConfig()
    assert (cfg.device, cfg.engine_device, cfg.engine_dtype) == (None, None, None)
    assert (cfg.rollout_device, cfg.rollout_dtype) == (None, "float32")
    bf16 = TrainLoopConfig(device="cpu", precision="bfloat16")
    assert (bf16.precision, bf16.rollout_device, bf16.rollout_dtype) == ("bf16", "cpu", "bfloat16")
    apart = TrainLoopConfig(device="cuda:0", engine_device="cuda:1", engine_dtype="auto")
    assert (apart.rollout_device, apart.rollout_dtype) == ("cuda:1", "auto")


@pytest.mark.parametrize(("args", "says"), [
    (["--device", "gpu"], ["--device", ACCEPTED]),
    (["--engine-device", "tpu"], ["--engine-device", ACCEPTED]),
    (["--dtype", "fp16"], ["--precision", "fp32", "bf16"]),
    (["--engine-dtype", "fp8"], ["--engine-dtype", "float32, bfloat16, float16"]),
    (["--engine", "vllm", "--engine-dtype", "float32"], ["--engine embedded"]),
    # well-formed but absent: refused before anything starts, not deep inside torch
    (["--device", "cuda:99"], ["--device", "cuda:99", "--device cpu"]),
    (["--engine-device", "cuda:99"], ["--engine-device", "cuda:99"]),
])
def test_envhub_train_refuses_bad_devices_and_dtypes_with_exit_2(tmp_path, args, says) -> None:
    result = runner.invoke(app, ["train", "arith", "--out", str(tmp_path / "run"), *args])
    assert result.exit_code == 2, result.output
    for word in says:
        assert word in result.output, result.output
    assert not (tmp_path / "run").exists()


def test_envhub_train_help_lists_the_flags() -> None:
    result = runner.invoke(app, ["train", "--help"], terminal_width=200)
    assert result.exit_code == 0
    for flag in ("--device", "--dtype", "--engine-device", "--engine-dtype"):
        assert flag in result.output


# A fresh interpreter: an earlier test of this session may have used CUDA where a GPU exists.
STEP_ON_CPU = textwrap.dedent("""
    import json, torch
    from envhub.trainer.config import OptimConfig, TrainerConfig
    from envhub.trainer.source import Group
    from envhub.trainer.synthetic import RolloutShape, sample_group
    from envhub.trainer.trainer import Trainer
    from tests.trainer.models import tiny_model

    shape = RolloutShape(sessions=2, turns=2, prompt_len=8, cm_every=0, keep_prompt=4)
    groups = [Group("g", sample_group(tiny_model("qwen2", seed=1), "g", shape, seed=0))]
    trainer = Trainer(tiny_model("qwen2"), TrainerConfig(
        device="cpu", precision="bf16", optim=OptimConfig(lr=1e-2)))
    metrics = trainer.step(groups)
    state = [t for s in trainer.optimizer.state.values() for t in s.values()
             if isinstance(t, torch.Tensor)]
    print(json.dumps({
        "cuda_initialized": torch.cuda.is_initialized(),
        "devices": sorted({str(p.device) for p in trainer.model.parameters()}
                          | {str(t.device) for t in state}),
        "param_dtypes": sorted({str(p.dtype) for p in trainer.model.parameters()}),
        "optimizer_tensors": len(state), "ratio_mean": metrics["is/ratio_mean"]}))
""")


def test_cpu_trainer_step_never_touches_cuda() -> None:
    done = subprocess.run([sys.executable, "-c", STEP_ON_CPU], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["cuda_initialized"] is False
    assert out["devices"] == ["cpu"] and out["optimizer_tensors"] > 0
    assert out["param_dtypes"] == ["torch.float32"]  # bf16: fp32 master weights, bf16 compute
    assert out["ratio_mean"] > 0


# `envhub train --device cpu` through the real command line, in a process of its own; at exit
# it reports whether anything (trainer, optimizer, embedded engine, weight push) created a CUDA
# context.
TRAIN_ON_CPU = textwrap.dedent("""
    import atexit, sys, torch
    atexit.register(lambda: print("CUDA_INITIALIZED", torch.cuda.is_initialized()))
    from envhub.cli import main
    sys.argv = ["envhub", *sys.argv[1:]]
    main()
""")


def test_envhub_train_device_cpu_keeps_everything_on_the_cpu(tmp_path) -> None:
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", TRAIN_ON_CPU, "train", "arith", "--device", "cpu", "--dtype",
         "bfloat16", "--steps", "1", "--out", str(out), "--groups", "1", "--k", "2",
         "--tasks", "2", "--max-turns", "2", "--sync", "--eval-every", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "CUDA_INITIALIZED False" in done.stdout, done.stdout[-2000:]
    assert "trainer on cpu in bfloat16, rollouts on cpu in bfloat16" in done.stdout
    row = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert {k: row[k] for k in ("train_device", "train_dtype", "rollout_device",
                                "rollout_dtype")} == {
        "train_device": "cpu", "train_dtype": "bfloat16", "rollout_device": "cpu",
        "rollout_dtype": "bfloat16"}
    # the mismatch between recorded and recomputed logprobs is in the row beside them
    assert "trainer/is/ratio_mean" in row and "trainer/kl/rollout_train_k3" in row


def test_precision_spellings_and_a_clear_refusal() -> None:
    """--dtype/--precision take either family's names in any case; `auto` or float16 (which
    the engine takes) are refused naming what the trainer computes in."""
    assert TrainerConfig(precision="BF16").precision == "bf16"
    assert TrainerConfig(precision=" Float32").precision == "fp32"
    for bad in ("auto", "float16"):
        with pytest.raises(ValueError, match="fp32 .float32. or bf16"):
            TrainerConfig(precision=bad)
