"""The verifiers side of `vf:` environments: run by `.venv-verifiers/bin/python`, one process per
call, stdlib + verifiers 0.4 (`verifiers.v1`) only. It never imports envhub (verifiers pins
dependencies envhub's lock does not admit), so the two sides meet only through argv, the
environment and JSON.

    worker.py tasks REF              -> {"env_id", "harnesses",
                                         "tasks": [{key, idx, id, name, prompt}]}
    worker.py rollout REF KEY OUT    -> verifiers' episode record (JSON) in the file OUT; replies
        {"ok", "calls", "stop", "errors"}. ENVHUB_VF_BASE_URL, ENVHUB_VF_API_KEY, ENVHUB_VF_MODEL:
        the rollout's gateway session; ENVHUB_VF_LIMITS: envhub's agent limits (JSON);
        ENVHUB_VF_ORACLE=1: a stand-in model answering the task's `answer` instead
    worker.py score REF KEY TRACE    -> {"rewards", "metrics", "reward", "error"}

REF is a taskset id as verifiers resolves it (an installed taskset package; `owner/name@v` hub
ids as verifiers strips them) or the path of a module file / package folder that exports a
`vf.Taskset` subclass in `__all__`. Each call prints one JSON object on stdout. Exit 0: done
(for `score`, a reward function that raised is data: {"error": ...}); 3: the environment, the
harness or verifiers failed ({"error": ...}); 4: this call's input (unknown task key, missing
trace file); 5: the environment uses what envhub does not support ({"unsupported": ...}).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import math
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

MAX_TASKS = 100_000
MAX_PROMPT_CHARS = 200_000
ERR_ENV, ERR_INPUT, ERR_UNSUPPORTED = 3, 4, 5


class InputError(Exception):
    """The call named something that is not there (a task key, a trace file)."""


class NoAnswer(InputError):
    """The oracle was asked for on a task without a reference answer."""


class Unsupported(Exception):
    """The environment needs what envhub does not run (a code-executing harness, a container,
    rewards that read the rollout's runtime, model judges)."""


def _taskset_id(ref: str) -> str:
    """A path becomes an importable module name, its folder first on sys.path (envhub's copy
    of the taskset: ENVHUB_VF_PATH, a JSON list, names the folders its siblings import from,
    searched after it)."""
    sys.path.extend(json.loads(os.environ.get("ENVHUB_VF_PATH") or "[]"))
    path = Path(ref).expanduser()
    if path.suffix == ".py" and path.is_file():
        sys.path.insert(0, str(path.resolve().parent))
        return path.stem
    if path.is_dir() and (path / "__init__.py").is_file():
        sys.path.insert(0, str(path.resolve().parent))
        return path.name
    return ref


def load_env(ref: str, limits: dict[str, Any] | None = None) -> Any:
    """verifiers' own loading (`resolve_env_config` + `load_environment`): the taskset's Env,
    else SingleAgentEnv. A seat keeps the taskset's bundled harness, but verifiers' `null` chat
    program replaces the `bash` default, which would run the model's commands on this machine
    (verifiers' subprocess runtime is no sandbox)."""
    import verifiers.v1 as vf  # type: ignore[import-not-found]

    taskset_id = _taskset_id(ref)
    config = vf.resolve_env_config({"taskset": {"id": taskset_id}})
    # Every seat runs in verifiers' subprocess runtime (its default is Prime's cloud sandbox):
    # the harness program talks to a loopback interception server that relays to envhub.
    pins = {role: {**getattr(config, role).model_dump(exclude_none=True),
                   "runtime": {"type": "subprocess"},
                   "harness": {"id": "null" if harness.id == "bash" else harness.id}}
            for role, harness in config.agent_harnesses().items()}
    config = vf.resolve_env_config({**config.model_dump(exclude_none=True), **pins})
    if limits:
        config = vf.resolve_env_config({**config.model_dump(exclude_none=True),
                                        **_limit_pins(config, limits)})
    env = vf.load_environment(config)
    for role, harness in env._harnesses.items():
        if harness.EXECUTES_CODE or harness.NEEDS_CONTAINER:
            raise Unsupported(f"seat {role!r} runs harness {harness.config.id!r}, which executes "
                              "the model's code or needs a container; envhub runs verifiers' "
                              "chat harnesses only")
    task_cls = type(env.taskset).task_type()
    if task_cls.NEEDS_CONTAINER:
        raise Unsupported(f"{task_cls.__name__} needs a container runtime")
    toolsets = [*task_cls.toolsets(env.taskset.config.task),
                *env.taskset.toolsets(env.taskset.config)]
    on_host = [type(t).__name__ for t in toolsets if _on_host(t.config)]
    if on_host:
        raise Unsupported(f"MCP toolsets {', '.join(on_host)} would run unsandboxed on this "
                          "machine with the model's arguments (verifiers' `subprocess` runtime, "
                          "its default for toolsets, or `colocated` with the harness, which "
                          "envhub runs there): give each a sandboxed runtime (verifiers 0.4 "
                          "offers docker, apptainer, e2b, modal, prime) or a `url` of a server "
                          "run elsewhere")
    return env


SANDBOXED_RUNTIMES = ("docker", "apptainer", "e2b", "modal", "prime")


def _on_host(config: Any) -> bool:
    """Whether a toolset would run on this machine: verifiers 0.4 launches it in its own
    `runtime` (default `subprocess`: a host process), or in the harness's seat when
    `colocated` (envhub pins seats to `subprocess`); a `url` is a server run elsewhere."""
    if getattr(config, "url", None):
        return False
    runtime = getattr(getattr(config, "runtime", None), "type", "subprocess")
    return bool(getattr(config, "colocated", False)) or runtime not in SANDBOXED_RUNTIMES


def _check_scoring(task: Any) -> None:
    """Scoring runs later, in a fresh process, on the recorded trace alone: a reward that reads
    the rollout's runtime, or a model judge, cannot be honoured there."""
    needs_runtime = [fn.__name__ for fn in (*task.hooks("metric"), *task.hooks("reward"))
                     if "runtime" in inspect.signature(fn).parameters]
    if needs_runtime:
        raise Unsupported(f"{type(task).__name__}: rewards/metrics read the runtime "
                          f"({', '.join(needs_runtime)})")
    if task.config.judges:
        raise Unsupported(f"{type(task).__name__}: model judges ({len(task.config.judges)})")


def _tasks(env: Any) -> list[Any]:
    if not env.taskset.bounded:
        raise Unsupported(f"{type(env.taskset).__name__} is infinite")
    tasks = []
    for task in env.taskset:
        tasks.append(task)
        if len(tasks) > MAX_TASKS:
            raise Unsupported(f"more than {MAX_TASKS} tasks")
    return tasks


def _find(env: Any, key: str) -> Any:
    for task in _tasks(env):
        if task.key == key:
            return task
    raise InputError(f"no task with key {key} in {env.config.env_id}")


def cmd_tasks(ref: str) -> dict[str, Any]:
    env = load_env(ref)
    rows = []
    for task in _tasks(env):
        _check_scoring(task)
        data = task.data
        rows.append({"key": task.key, "idx": data.idx, "id": data.id, "name": data.name,
                     "prompt": data.prompt_text[:MAX_PROMPT_CHARS]})
    return {"env_id": env.config.env_id,
            "harnesses": {role: h.config.id for role, h in env._harnesses.items()},
            "tasks": rows}


def _run_here() -> None:
    """verifiers prepares a harness program with `uv sync --script` (network, every box). The
    `null` chat program's packages (openai, mcp, httpx...) are verifiers' own dependencies,
    locked in this venv, so the program runs with this interpreter instead: no download."""
    from verifiers.v1.runtimes.subprocess import (  # type: ignore[import-not-found]
        SubprocessRuntime,
    )

    async def prepare_uv_script(self: Any, script: str | bytes, env: Any = None, *,
                                activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        path = Path(self.workdir or ".") / ".envhub-vf-program.py"
        path.write_bytes(data)
        return [sys.executable, str(path)]

    SubprocessRuntime.prepare_uv_script = prepare_uv_script  # type: ignore[method-assign]


def _limit_pins(config: Any, limits: dict[str, Any]) -> dict[str, Any]:
    """envhub's agent limits onto every seat, where the environment did not pin its own."""
    pins = {}
    for role in config.agent_harnesses():
        seat = getattr(config, role)
        pin: dict[str, Any] = {}
        if seat.max_turns is None and limits.get("max_turns"):
            pin["max_turns"] = int(limits["max_turns"])
        if seat.max_output_tokens is None and limits.get("max_tokens"):
            pin["max_output_tokens"] = int(limits["max_tokens"])
        if seat.sampling is None and limits.get("max_tokens_per_turn"):
            pin["sampling"] = {"max_tokens": int(limits["max_tokens_per_turn"])}
        if seat.timeout.rollout is None and limits.get("time_limit_s"):
            pin["timeout"] = {**seat.timeout.model_dump(exclude_none=True),
                              "rollout": float(limits["time_limit_s"])}
        if pin:
            pins[role] = {**seat.model_dump(exclude_none=True), **pin}
    return pins


async def cmd_rollout(ref: str, key: str, out: str) -> dict[str, Any]:
    import verifiers.v1 as vf  # type: ignore[import-not-found]
    from verifiers.v1.env import RunSlot  # type: ignore[import-not-found]

    _run_here()
    env = load_env(ref, json.loads(os.environ.get("ENVHUB_VF_LIMITS") or "{}"))
    task = _find(env, key)
    _check_scoring(task)
    async with contextlib.AsyncExitStack() as stack:
        if os.environ.get("ENVHUB_VF_ORACLE"):
            answer = getattr(task.data, "answer", None)
            if answer is None:
                raise NoAnswer(f"task {key} has no reference answer (an `answer` field) for "
                               "the oracle")
            base_url = stack.enter_context(stand_in_model(str(answer)))
            os.environ["ENVHUB_VF_API_KEY"] = "oracle"
        else:
            base_url = os.environ["ENVHUB_VF_BASE_URL"]
        client = vf.EvalClientConfig(base_url=base_url, api_key_var="ENVHUB_VF_API_KEY")
        ctx = vf.ModelContext(client=client, model=os.environ.get("ENVHUB_VF_MODEL", "default"))
        # Scoring is deferred: the `score` call grades the trace in a process of its own.
        async with env.serving():
            episode = await env.run_slot(RunSlot(task.defer_scoring()), ctx)
    record = episode.model_dump(mode="json")
    Path(out).write_text(json.dumps(record))
    errors = [*record.get("errors", []),
              *(e for t in record.get("traces", []) for e in t.get("errors", []))]
    return {"ok": bool(record.get("ok")),
            "calls": sum(len(t.get("calls", [])) for t in record.get("traces", [])),
            "stop": [t.get("stop_condition") for t in record.get("traces", [])],
            "errors": [{"type": e.get("type"), "message": str(e.get("message"))[:2000],
                        "status_code": e.get("status_code")} for e in errors[:20]]}


@contextlib.contextmanager
def stand_in_model(answer: str) -> Any:
    """A loopback OpenAI-compatible endpoint that answers every chat completion with `answer`
    (streamed when asked): the oracle's model, so the gold answer goes through the harness."""
    import http.server
    import threading
    import time

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("content-length") or 0)))
            base = {"id": "oracle", "created": int(time.time()), "model": body.get("model")}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            if not body.get("stream"):
                reply = {**base, "object": "chat.completion", "usage": usage, "choices": [
                    {"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": answer}}]}
                return self._send("application/json", json.dumps(reply).encode())
            chunks: list[dict[str, Any]] = [{"choices": [{"index": 0, "delta": {"role": "assistant",
                                                          "content": answer}}]},
                      {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
                      {"choices": [], "usage": usage}]
            events = b"".join(b"data: " + json.dumps({**base, "object": "chat.completion.chunk",
                                                       **c}).encode() + b"\n\n" for c in chunks)
            self._send("text/event-stream", events + b"data: [DONE]\n\n")

        def _send(self, kind: str, data: bytes) -> None:
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()


async def cmd_score(ref: str, key: str, trace_file: str) -> dict[str, Any]:
    import verifiers.v1 as vf  # type: ignore[import-not-found]

    env = load_env(ref)
    task = _find(env, key)
    _check_scoring(task)
    path = Path(trace_file)
    if not path.is_file():
        raise InputError(f"{trace_file}: no trace")
    episode = vf.WireEpisode.model_validate_json(path.read_bytes())
    rewards: dict[str, float | None] = {}
    metrics: dict[str, float | None] = {}
    total = 0.0
    for trace in episode.traces:
        try:
            await task.score(trace)
        except Exception as e:  # a reward function raising on the model's output: data
            return {"error": f"{type(e).__name__}: {e}"[:4000], "rewards": {}, "metrics": {}}
        for name, reward in trace.rewards.items():
            rewards[name] = None if reward is None else reward.score
        metrics.update(trace.metrics)
        total += trace.reward
    if not math.isfinite(total):
        return {"error": f"reward is {total}", "rewards": rewards, "metrics": metrics}
    return {"reward": total, "rewards": rewards, "metrics": metrics, "traces": len(episode.traces)}


async def _until_sigterm(call: Any) -> Any:
    """`call`, cancelled on SIGTERM (envhub's stop: process.py), so that verifiers' own clean-up
    runs (`env.serving()`, the subprocess runtime): it stops the harness program and toolsets,
    which it starts in sessions of their own, out of reach of a signal to this process group."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await call


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    if len(argv) < 2 or argv[0] not in ("tasks", "rollout", "score"):
        print(__doc__, file=sys.stderr)
        return 2
    cmd, ref, rest = argv[0], argv[1], argv[2:]
    try:
        with contextlib.redirect_stdout(sys.stderr):  # library prints must not corrupt the reply
            if cmd == "tasks":
                reply = cmd_tasks(ref)
            elif cmd == "rollout":
                reply = asyncio.run(_until_sigterm(cmd_rollout(ref, rest[0], rest[1])))
            else:
                reply = asyncio.run(_until_sigterm(cmd_score(ref, rest[0], rest[1])))
    except asyncio.CancelledError:  # SIGTERM: verifiers cleaned up on the way out
        print(json.dumps({"error": "stopped (SIGTERM)"}))
        return 128 + signal.SIGTERM
    except Unsupported as e:
        print(json.dumps({"unsupported": str(e)}))
        return ERR_UNSUPPORTED
    except InputError as e:
        print(json.dumps({"error": str(e), "no_answer": isinstance(e, NoAnswer)}))
        return ERR_INPUT
    except Exception as e:  # noqa: BLE001 - the environment or verifiers failed: report it
        traceback.print_exc()
        print(json.dumps({"error": f"{type(e).__name__}: {e}"[:4000]}))
        return ERR_ENV
    print(json.dumps(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
