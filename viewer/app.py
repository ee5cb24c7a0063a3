"""The viewer's web app: server-rendered HTML (Jinja2, autoescaped) over a source, no script
and nothing fetched from the network.

    /                                  runs with counts by status and mean reward
    /sessions?run=&env=&task=&status=&min_reward=&max_reward=   sessions, filtered
    /runs/{run_id}/sessions/{key}      one session: token-level trajectory, rewards, status
    /runs/{run_id}/curves              an `envhub train` run: every series of metrics.jsonl
                                       as charts (curves.py), its resolved config
    /compare?run=A&run=B               two or more such runs overlaid, chart by chart
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from jinja2 import Environment, FileSystemLoader
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from envhub import __version__
from envhub.sdk.types import CMAction
from envhub.viewer.curves import read_metrics, read_samples, render
from envhub.viewer.errors import ViewerError
from envhub.viewer.sources import PoolSource, RunFolders, SessionRow
from envhub.viewer.tokens import TokenDecoder
from envhub.viewer.turns import ChainNode, TurnBlock, chain_tree, turn_blocks

HERE = Path(__file__).parent
STATUSES = ("done", "env_failure", "agent_error", "open")


# Every page: no script of any kind (inline, remote or eval), nothing fetched from elsewhere;
# the stylesheet is ours and the token shading an inline style attribute (CSS, not code).
CSP = ("default-src 'none'; script-src 'none'; style-src 'self'; style-src-attr "
       "'unsafe-inline'; img-src 'self' data:; font-src 'self'; form-action 'self'; "
       "base-uri 'none'; frame-ancestors 'none'")


def readable(info: Any) -> str:
    """A reward's or signal's info as text a person reads: one `key: value` line each, a
    string value with its own line breaks kept (a test log), anything else as JSON."""
    if not isinstance(info, dict):
        return json.dumps(info, ensure_ascii=False, default=str)
    lines = []
    for key, value in info.items():
        if isinstance(value, str):
            lines.append(f"{key}:\n{value}" if "\n" in value else f"{key}: {value}")
        else:
            lines.append(f"{key}: {json.dumps(value, ensure_ascii=False, default=str)}")
    return "\n".join(lines)


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
    env.filters["num"] = lambda v, d=3: "–" if v is None else f"{v:.{d}f}"
    env.filters["readable"] = readable
    env.globals["version"] = __version__
    return env


class BadFilter(Exception):
    pass


def _number(name: str, text: str | None) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = float(text)
    except ValueError:
        raise BadFilter(f"{name}: {text!r} is not a number; use e.g. 0.5 or -1") from None
    if not math.isfinite(value):
        raise BadFilter(f"{name}: give a finite number, not {text!r}")
    return value


def _matches(r: SessionRow, q: dict[str, Any]) -> bool:
    if q["run"] and r.run_id != q["run"]:
        return False
    if q["env"] and r.env != q["env"]:
        return False
    if q["status"] and r.status != q["status"]:
        return False
    if q["task"] and q["task"].lower() not in r.task_id.lower():
        return False
    if q["min_reward"] is not None and (r.reward is None or r.reward < q["min_reward"]):
        return False
    return not (q["max_reward"] is not None and (r.reward is None or r.reward > q["max_reward"]))


def create_app(source: RunFolders | PoolSource) -> FastAPI:
    app = FastAPI(title="envhub view", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    templates = _templates()

    @app.middleware("http")
    async def _headers(request: Request, call_next: Any) -> Any:
        response = await call_next(request)
        response.headers["content-security-policy"] = CSP
        response.headers["x-content-type-options"] = "nosniff"
        return response
    decoders: dict[Path, TokenDecoder] = {}

    def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        html = templates.get_template(name).render(source=source, **values)
        return HTMLResponse(html, status_code=status)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_req: Request, exc: StarletteHTTPException) -> HTMLResponse:
        return page("error.html", exc.status_code, message=str(exc.detail))

    @app.exception_handler(BadFilter)
    async def _bad_filter(_req: Request, exc: BadFilter) -> HTMLResponse:
        return page("error.html", 400, message=str(exc))

    @app.api_route("/", methods=["GET", "HEAD"], response_class=HTMLResponse)
    async def runs() -> HTMLResponse:
        folders = getattr(source, "folders", {})
        trained = {name for name, folder in folders.items() if (folder / "metrics.jsonl").is_file()}
        return page("runs.html", runs=await run_in_threadpool(source.runs), trained=trained)

    @app.api_route("/sessions", methods=["GET", "HEAD"], response_class=HTMLResponse)
    async def sessions(run: str = "", env: str = "", task: str = "", status: str = "",
                       min_reward: str = "", max_reward: str = "") -> HTMLResponse:
        q = {"run": run, "env": env, "task": task, "status": status,
             "min_reward": _number("min_reward", min_reward),
             "max_reward": _number("max_reward", max_reward)}
        rows = await run_in_threadpool(source.sessions)
        shown = [r for r in rows if _matches(r, q)]
        return page("sessions.html", rows=shown, total=len(rows), q=q,
                    form={"run": run, "env": env, "task": task, "status": status,
                          "min_reward": min_reward, "max_reward": max_reward},
                    runs=sorted({r.run_id for r in rows}), envs=sorted({r.env for r in rows}),
                    statuses=sorted(set(STATUSES) | {r.status for r in rows}))

    @app.api_route("/runs/{run_id}/sessions/{key}", methods=["GET", "HEAD"],
                   response_class=HTMLResponse)
    async def session(run_id: str, key: str) -> HTMLResponse:
        view = await run_in_threadpool(source.session, run_id, key)
        if view is None:
            raise StarletteHTTPException(404, f"no session {key!r} in run {run_id!r}")
        blocks: list[TurnBlock] = []
        loose: list[CMAction] = []
        chains: list[ChainNode] = []
        if view.trajectory is not None:
            chains = chain_tree(view.trajectory)
            try:
                if view.tokenizer not in decoders:
                    decoders[view.tokenizer] = await run_in_threadpool(TokenDecoder,
                                                                       view.tokenizer)
            except ViewerError as e:  # the run's model folder is gone: say so, show the rest
                view.note = f"cannot decode this session's tokens: {e}"
            else:
                blocks, loose = await run_in_threadpool(turn_blocks, view.trajectory,
                                                        decoders[view.tokenizer])
        return page("session.html", view=view, blocks=blocks, loose=loose, chains=chains)

    drawn: dict[tuple[tuple[str, int, int], ...], list[Any]] = {}  # the last pages drawn

    async def charts_of(names: list[str], folders: list[Path]) -> list[Any]:
        """The charts of these runs, drawn again only when a metrics file changed."""
        key = tuple((str(f), *_stamp(f / "metrics.jsonl")) for f in folders)
        if key not in drawn:
            rows = [read_metrics(f) for f in folders]
            drawn[key] = await run_in_threadpool(render, list(zip(names, rows, strict=True)))
            while len(drawn) > 16:
                drawn.pop(next(iter(drawn)))
        return drawn[key]

    def trained(run_id: str) -> tuple[Path, list[dict[str, Any]]]:
        folder = getattr(source, "folders", {}).get(run_id)
        rows = read_metrics(folder) if folder is not None else []
        if folder is None or not rows:
            raise StarletteHTTPException(404, f"no training run {run_id!r} here (curves are "
                                         "drawn from an envhub train folder's metrics.jsonl)")
        return folder, rows

    @app.api_route("/runs/{run_id}/curves", methods=["GET", "HEAD"],
                   response_class=HTMLResponse)
    async def curves(run_id: str) -> HTMLResponse:
        folder, rows = trained(run_id)
        charts = await charts_of([run_id], [folder])
        return page("curves.html", runs=[run_id], charts=charts, rows=len(rows),
                    config=_config(folder), samples=read_samples(folder))

    @app.api_route("/compare", methods=["GET", "HEAD"], response_class=HTMLResponse)
    async def compare(run: list[str] = Query(default=[])) -> HTMLResponse:  # noqa: B008
        names = list(dict.fromkeys(run))
        if len(names) < 2:
            raise BadFilter("choose two or more training runs to compare (?run=A&run=B)")
        if len(names) > MAX_COMPARED:
            raise BadFilter(f"compare at most {MAX_COMPARED} runs at once")
        folders = [trained(name)[0] for name in names]
        charts = await charts_of(names, folders)
        return page("curves.html", runs=names, charts=charts, rows=None, config=None,
                    samples=[])

    return app


MAX_COMPARED = 8


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_size)


def _config(folder: Path) -> str:
    """run.json's resolved config as indented JSON (empty when there is none)."""
    try:
        config = json.loads((folder / "run.json").read_text()).get("config")
    except (OSError, ValueError, AttributeError):
        return ""
    return json.dumps(config, indent=1, sort_keys=True) if config else ""
