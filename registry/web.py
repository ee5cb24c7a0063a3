"""The registry's browsable HTML index: `/` (also `/ui`) lists packages with their versions and
descriptions (`?q=` searches), `/ui/{owner}/{name}` shows one package's versions and the
manifest of one of them (`?version=`, default: latest).

Everything shown comes from publishers, so it is attacker-controlled: templates autoescape,
and a Content-Security-Policy forbids scripts on these pages altogether.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, Query
from fastapi.responses import HTMLResponse
from jinja2 import Environment, FileSystemLoader
from starlette.concurrency import run_in_threadpool

from envhub import __version__
from envhub.registry.catalog import Catalog
from envhub.registry.errors import NotFound, RegistryError
from envhub.registry.refs import check_name, check_owner

CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; base-uri 'none'"
INDEX_LIMIT = 100  # packages listed per page (the search API's own maximum)


def _templates() -> Environment:
    env = Environment(loader=FileSystemLoader(Path(__file__).parent / "templates"),
                      autoescape=True)
    env.filters["when"] = lambda t: time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t))
    env.globals["version"] = __version__
    return env


def add_html_index(app: FastAPI, catalog: Catalog) -> None:
    templates = _templates()

    def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        html = templates.get_template(name).render(**values)
        return HTMLResponse(html, status_code=status, headers={
            "Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff"})

    def listing(q: str) -> list[dict[str, Any]]:
        rows = []
        for hit in catalog.search(q, INDEX_LIMIT):
            rows.append({"hit": hit, "versions": catalog.versions(hit.owner, hit.name)})
        return rows

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    @app.get("/ui", response_class=HTMLResponse, include_in_schema=False)
    async def index(q: Annotated[str, Query()] = "") -> HTMLResponse:
        try:
            rows = await run_in_threadpool(listing, q)
        except RegistryError as e:  # e.g. a query over the length limit
            return page("error.html", e.status_code, message=e.message)
        return page("index.html", rows=rows, q=q, limit=INDEX_LIMIT)

    @app.get("/ui/{owner}/{name}", response_class=HTMLResponse, include_in_schema=False)
    async def package(owner: str, name: str, version: str = "") -> HTMLResponse:
        try:
            info = await run_in_threadpool(catalog.package, check_owner(owner),
                                           check_name(name))
            shown = version or info.latest or info.versions[-1].version
            if shown not in {v.version for v in info.versions}:
                raise NotFound(f"{owner}/{name} has no version {version!r}; pick one below")
            manifest = await run_in_threadpool(catalog.manifest_text, owner, name, shown)
        except RegistryError as e:
            return page("error.html", e.status_code, message=e.message)
        return page("package.html", info=info, shown=shown, manifest=manifest)
