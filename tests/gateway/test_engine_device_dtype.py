"""The embedded engine's device and dtype (issue 28): `EngineConfig` and `GatewayConfig` take
them, `envhub engine` and `envhub gateway` check them like any flag, and the engine loads the
bundled model in the dtype asked for."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from envhub.cli import app
from envhub.gateway.backends.base import GenerateRequest, SamplingParams
from envhub.gateway.config import GatewayConfig
from envhub.gateway.engine.config import BUNDLED_MODEL, EngineConfig

torch = pytest.importorskip("torch")

from envhub.gateway.backends.local import LocalBackend  # noqa: E402
from envhub.gateway.engine.engine import Engine  # noqa: E402

runner = CliRunner()
ACCEPTED = "auto, cpu, cuda, cuda:N"


def _greedy(engine: Engine) -> list[float]:
    request = GenerateRequest([151644, 872, 198], SamplingParams(max_tokens=3, temperature=0))
    return asyncio.run(engine.generate(request)).logprobs


def test_engine_loads_the_model_in_the_dtype_asked_for() -> None:
    engine = Engine(EngineConfig(model=str(BUNDLED_MODEL), device="cpu", dtype="bfloat16"))
    try:
        assert engine.device.type == "cpu" and engine.dtype == torch.bfloat16
        assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
        assert {p.device.type for p in engine.model.parameters()} == {"cpu"}
        assert len(_greedy(engine)) == 3
    finally:
        engine.close()


def test_auto_is_float32_on_the_cpu() -> None:
    engine = Engine(EngineConfig(model=str(BUNDLED_MODEL), device="cpu"))
    try:
        assert engine.dtype == torch.float32
        assert {p.dtype for p in engine.model.parameters()} == {torch.float32}
    finally:
        engine.close()


def test_gateway_config_passes_device_and_dtype_to_the_engine() -> None:
    config = GatewayConfig(device="CPU", dtype="bfloat16", engine_max_batch=2, max_model_len=64)
    assert (config.device, config.dtype) == ("cpu", "bfloat16")
    assert GatewayConfig().dtype == "auto" and GatewayConfig().device is None
    backend = LocalBackend.from_config(config)
    try:
        assert backend.engine.config.dtype == "bfloat16" and backend.engine.config.device == "cpu"
        assert backend.engine.dtype == torch.bfloat16
    finally:
        asyncio.run(backend.aclose())


def test_configs_refuse_bad_names() -> None:
    for make in (lambda: EngineConfig(device="gpu"), lambda: GatewayConfig(device="gpu")):
        with pytest.raises(ValueError, match=ACCEPTED):
            make()
    for make in (lambda: EngineConfig(dtype="fp8"), lambda: GatewayConfig(dtype="fp8")):
        with pytest.raises(ValueError, match="auto, float32, bfloat16, float16"):
            make()


@pytest.mark.parametrize(("args", "says"), [
    (["engine", "--device", "gpu"], ["--device", ACCEPTED]),
    (["engine", "--dtype", "fp8"], ["--dtype", "float32, bfloat16, float16"]),
    (["engine", "--device", "cuda:99"], ["cuda:99", "--device cpu"]),  # no such GPU here
    (["gateway", "--device", "gpu"], ["--device", ACCEPTED]),
    (["gateway", "--dtype", "half"], ["--dtype", "float32, bfloat16, float16"]),
    (["gateway", "--device", "cuda:99"], ["cuda:99", "--device cpu"]),
])
def test_cli_refuses_bad_devices_and_dtypes_with_exit_2(tmp_path, args, says) -> None:
    extra = ["--db", f"sqlite:///{tmp_path / 'pool.db'}"] if args[0] == "gateway" else []
    result = runner.invoke(app, [*args, *extra])
    assert result.exit_code == 2, result.output
    for word in says:
        assert word in result.output, result.output
