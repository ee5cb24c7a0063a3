"""MkDocs hook: the reference pages are generated from the code at build time, never written
twice. A page asks for a table with a marker on a line of its own:

    <!-- envhub-reference: cli -->          every command of `envhub`, every flag (click's
                                            parameters, which the pydantic configs generate)
    <!-- envhub-reference: manifest -->     every field of envhub.toml (envs/manifest.py)
    <!-- envhub-reference: http gateway --> the gateway's routes (its OpenAPI schema)
    <!-- envhub-reference: http registry --> the registry server's routes
    <!-- envhub-reference: trajectory -->   a real session recorded by a real gateway (scripted
                                            model) at build time, drawn
    <!-- envhub-reference: metrics -->      every column of OUT/metrics.jsonl: the rows of a real
                                            one-step `envhub train` run on the bundled model
                                            (cached by the sources' digest), then the names the
                                            code emits only under options

The code is imported from the checkout the docs are built in (the folder above docs/), so a
field added to a config shows up in the next build.
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"^<!-- envhub-reference: ([a-z]+)(?: ([a-z]+))? -->$", re.M)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if "envhub-reference" not in markdown:
        return markdown
    if str(ROOT) not in sys.path[:1]:
        sys.path.insert(0, str(ROOT))  # this checkout's envhub, before any installed one
    return MARKER.sub(lambda m: _generate(m.group(1), m.group(2)), markdown)


def _generate(kind: str, arg: str | None) -> str:
    if kind == "cli":
        return cli_reference()
    if kind == "manifest":
        return manifest_reference()
    if kind == "http" and arg in ("gateway", "registry"):
        return http_reference(arg)
    if kind == "trajectory":
        return trajectory_figure()
    if kind == "metrics":
        return metrics_reference()
    raise ValueError(f"unknown reference marker: {kind} {arg or ''}")


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|") or " "


def cli_reference() -> str:
    import typer.main

    from envhub.cli import app

    root = typer.main.get_command(app)
    out: list[str] = []

    def walk(command: Any, path: list[str]) -> None:  # typer's own click: duck-typed
        if hasattr(command, "commands"):
            for name in sorted(command.commands):
                walk(command.commands[name], [*path, name])
            return
        name = " ".join(path)
        out.append(f"### `envhub {name}`\n")
        summary = (command.help or command.short_help or "").strip().split("\n\n")[0]
        if summary:
            out.append(_cell(summary) + "\n")
        rows = []
        for param in command.params:
            if param.param_type_name == "argument":
                rows.append((f"`{param.name.upper()}`", "argument", "",
                             getattr(param, "help", "") or ""))
            elif param.param_type_name == "option" and not param.hidden:
                flags = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
                default = "" if param.default in (None, (), [], False) or callable(
                    param.default) else f"`{param.default}`".replace(f"{ROOT}/", "")
                rows.append((flags, "flag" if param.is_flag else _type_name(param), default,
                             (param.help or "").replace("\\[", "[")))
        if rows:
            out.append("| flag | type | default | what it does |\n|---|---|---|---|")
            out.extend(f"| {_cell(f)} | {_cell(t)} | {_cell(d)} | {_cell(h)} |"
                       for f, t, d, h in rows)
        out.append("")

    walk(root, [])
    return "\n".join(out)


def _type_name(param: Any) -> str:
    if param.metavar:
        return str(param.metavar)
    kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    name = kind.__name__ if isinstance(kind, type) else str(kind or "text")
    return name.replace("typing.", "").replace("pathlib.", "")


def manifest_reference() -> str:
    from pydantic import BaseModel

    from envhub.envs.manifest import Manifest

    out: list[str] = []
    seen: set[type] = set()

    def models_in(annotation: Any) -> list[type[BaseModel]]:
        found = []
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.append(annotation)
        for arg in getattr(annotation, "__args__", ()) or ():
            found.extend(models_in(arg))
        return found

    def section(model: type[BaseModel], title: str) -> None:
        if model in seen:
            return
        seen.add(model)
        out.append(f"### `{title}`\n")
        doc = (model.__doc__ or "").strip().split("\n\n")[0]
        if doc:
            out.append(_cell(doc) + "\n")
        out.append("| field | type | default | what it is |\n|---|---|---|---|")
        nested = []
        for name, field in model.model_fields.items():
            key = field.alias or name
            default = "required" if field.is_required() else (
                "" if field.default_factory is not None or field.default is None
                else f"`{field.default!r}`")
            kind = getattr(field.annotation, "__name__", None) or str(field.annotation)
            kind = kind.replace("typing.", "").replace("pathlib.", "")
            out.append(f"| `{key}` | {_cell(kind)} | {_cell(default)} | "
                       f"{_cell(field.description or '')} |")
            nested.extend((sub, f"{title}.{key}" if title != "envhub.toml" else f"[{key}]")
                          for sub in models_in(field.annotation))
        out.append("")
        for sub, sub_title in nested:
            section(sub, sub_title)

    section(Manifest, "envhub.toml")
    return "\n".join(out)


def http_reference(which: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        if which == "gateway":
            from envhub.gateway.config import GatewayConfig
            from envhub.gateway.server import create_app

            # the zero backend: the same routes, no model loaded
            app = create_app(GatewayConfig(db=f"sqlite:///{tmp}/pool.db", backend="zero"))
        else:
            from envhub.registry.server import ServerConfig
            from envhub.registry.server import create_app as registry_app

            app = registry_app(ServerConfig(data=Path(tmp)))
        schema = app.openapi()
    out = ["| method | path | what it does |", "|---|---|---|"]
    for path, methods in sorted(schema.get("paths", {}).items()):
        for method, op in sorted(methods.items()):
            what = (op.get("description") or "").split("\n\n")[0] or op.get("summary", "")
            out.append(f"| {method.upper()} | `{path}` | {_cell(what)} |")
    return "\n".join(out) + "\n"


# The session the trajectory page draws: an agent's tool call and its answer, a side call on the
# same key (a title request, as coding CLIs make), then the agent summarising its own history.
_SCRIPT = ['<tool_call>\n{"name": "calculator", "arguments": {"expression": "17*23"}}\n'
           "</tool_call>", "17*23 = 391.", "Arithmetic question", "391."]
_TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}}}]


def record_session() -> dict[str, Any]:
    """Run the calls above through a gateway (scripted backend, the bundled tokenizer, a
    SQLite pool) and return the session's trajectory as `GET /sessions/ID/trajectory` does."""
    import json

    from fastapi.testclient import TestClient

    from envhub.gateway.config import GatewayConfig
    from envhub.gateway.server import create_app

    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "script.json"
        script.write_text(json.dumps(_SCRIPT))
        app = create_app(GatewayConfig(db=f"sqlite:///{tmp}/pool.db", backend="scripted",
                                       script=str(script)))
        with TestClient(app) as client:
            auth = {"Authorization": "Bearer demo"}

            def chat(messages: list[dict], tools: list | None = None) -> dict:
                body = {"model": "default", "messages": messages, **({"tools": tools} if tools
                                                                   else {})}
                answer = client.post("/v1/chat/completions", headers=auth, json=body)
                answer.raise_for_status()
                return answer.json()["choices"][0]["message"]

            history = [{"role": "system", "content": "You solve arithmetic."},
                       {"role": "user", "content": "What is 17*23?"}]
            call = chat(history, _TOOLS)
            history += [call, {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"],
                               "content": "391"}]
            history.append(chat(history, _TOOLS))
            chat([{"role": "user", "content": "A title for: What is 17*23?"}])
            chat([*history[:2], {"role": "user", "content": "Answer with the number only."}],
                 _TOOLS)
            trajectory = client.get("/sessions/demo/trajectory")
            trajectory.raise_for_status()
            return trajectory.json()


def trajectory_figure() -> str:
    t = record_session()
    turns, segments, actions = t["turns"], t["segments"], t["cm_actions"]
    chains = sorted({turn["chain"] for turn in turns})
    head = (f"session demo: {len(turns)} turns, {len(segments)} segments, {len(chains)} "
            f"chains, {len(actions)} CM action{'s' if len(actions) != 1 else ''}")
    lines = [head, ""]
    by_seq = {a["seq"]: a for a in actions}
    for chain in chains:
        label = f"chain {chain}"
        for segment in (s for s in segments if s["chain"] == chain):
            seg_label = f"seg {segment['index']}"
            for i, seq in enumerate(segment["turn_seqs"]):
                turn = turns[seq]
                prompt = (f"{len(turn['prompt_delta_ids'])} prompt ids" if i == 0
                          else f"+{len(turn['prompt_delta_ids'])} appended")
                calls = ", ".join(c["name"] for c in turn["tool_calls"])
                what = f"{len(turn['completion_ids'])} sampled, {turn['finish_reason']}"
                what += f" -> {calls}" if calls else ""
                lines.append(f"{label:<8}{seg_label if i == 0 else '':<6}turn {seq}: "
                             f"{prompt:<16}| {what}")
                if seq in by_seq:
                    a = by_seq[seq]
                    lines.append(f"{'':<14}^ CM action {a['kind']} ({a['source']}) of turn "
                                 f"{a['from_seq']}'s history:")
                    lines.append(f"{'':<16}messages {a['removed']} -> {a['added']}, context "
                                 f"{a['tokens_before']} -> {a['tokens_after']} ids")
                label = ""
    lines.append("")
    for segment in segments:
        mask = segment["loss_mask"]
        runs, start = [], 0
        for i in range(1, len(mask) + 1):
            if i == len(mask) or mask[i] != mask[start]:
                runs.append(("sampled" if mask[start] else "prompt") + f" {i - start}")
                start = i
        lines.append(f"seg {segment['index']} ({len(segment['token_ids'])} ids): "
                     + " | ".join(runs))
    lines.append("(the loss mask is 1 on the sampled runs only)")
    return "```text\n" + "\n".join(lines) + "\n```\n"


# -- metrics ---------------------------------------------------------------------------------

# What each namespace of a metrics row is: the prose of the page; the names come from the run.
NAMESPACES = {
    "": "the step's rollouts (the groups it trained on: failures counted, never averaged in as "
        "zeros), its timing in seconds, the producer's state, the weight version trained",
    "trainer/": "the trainer's own statistics of the step (trainer/*.py): the objective's "
                "terms, the importance-sampling mask, KL estimates, entropy, packing",
    "filter/": "what each filter removed or added this step (0 when nothing happened)",
    "staleness/": "how many weight versions behind the trainer the trained samples were",
    "versions/": "samples whose turns were drawn under more than one weight version",
    "mix/": "per environment (mix/ENV/...): groups launched, samples trained and dropped stale, "
            "its share of the step",
    "env/": "per environment, with several: the rollout metrics above (env/ENV/...)",
    "eval/": "held-out evaluation rows (phase eval): the rollout metrics on tasks never trained on",
    "dynamic/": "--dynamic-sampling: groups with signal, extra groups drawn, the bound reached",
    "difficulty/": "--difficulty-filter: tasks it has seen solved always or never",
}
# groups of 4 on arith, where the bundled model solves about half: a step with signal, so the
# optimizer step's own columns (grad/norm, ...) are in the row
METRIC_RUN = ["arith", "--steps", "1", "--groups", "4", "--k", "4", "--max-turns", "2",
              "--eval-every", "1", "--eval-tasks", "1", "--eval-samples", "1",
              "--seed", "0", "-q"]


def recorded_metrics() -> list[dict[str, Any]]:
    """The rows of `envhub train METRIC_RUN` run with this checkout's envhub, cached in the
    temporary folder by the digest of the code that writes them (trainer/, orchestrator/)."""
    import hashlib
    import json
    import os
    import subprocess

    digest = hashlib.sha256()
    for folder in ("trainer", "orchestrator"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            digest.update(path.relative_to(ROOT).as_posix().encode() + path.read_bytes())
    cache = Path(tempfile.gettempdir()) / f"envhub-docs-metrics-{digest.hexdigest()[:16]}.jsonl"
    if not cache.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "ENVHUB_HOME": f"{tmp}/home"}
            ran = subprocess.run([sys.executable, "-m", "envhub", "train", *METRIC_RUN,
                                  "--out", f"{tmp}/run"], cwd=ROOT, env=env,
                                 capture_output=True, text=True, timeout=600, check=False)
            if ran.returncode != 0:
                raise RuntimeError(f"the metrics reference's training run failed: "
                                   f"{ran.stderr[-3000:]}")
            rows = (Path(tmp) / "run" / "metrics.jsonl").read_text()
        partial = cache.with_suffix(f".{os.getpid()}")
        partial.write_text(rows)
        partial.replace(cache)
    return [json.loads(line) for line in cache.read_text().splitlines() if line.strip()]


def emitted_keys() -> dict[str, str]:
    """Metric-shaped string keys (`a/b`) of dict displays and item assignments in the code that
    emits rows (trainer/, orchestrator/training/): {key: "file:line"}."""
    import ast

    shape = re.compile(r"^[a-z][a-z0-9_]*(/[a-z0-9_]+)+$")
    found: dict[str, str] = {}
    for folder in ("trainer", "orchestrator/training"):
        for path in sorted((ROOT / folder).glob("*.py")):
            if path.name.startswith(("recipe_", "export")):  # other formats' columns, not rows
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                keys: list[Any] = []
                if isinstance(node, ast.Dict):
                    keys = [k for k in node.keys if k is not None]
                elif isinstance(node, ast.Assign):
                    keys = [t.slice for t in node.targets if isinstance(t, ast.Subscript)]
                for key in keys:
                    if (isinstance(key, ast.Constant) and isinstance(key.value, str)
                            and shape.match(key.value)):
                        found.setdefault(key.value,
                                         f"{path.relative_to(ROOT).as_posix()}:{key.lineno}")
    return found


def _namespace(name: str) -> str:
    head, sep, _ = name.partition("/")
    return f"{head}/" if sep and f"{head}/" in NAMESPACES else ""


def _example(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list):
        return f"[{len(value)} items]"
    return str(value)


def metrics_reference() -> str:
    rows = recorded_metrics()
    train = next(r for r in rows if r["phase"] == "train")
    evals = [r for r in rows if r["phase"] == "eval"]
    seen = set(train) | {k for r in evals for k in r}
    out = [f"A real run (`envhub train {' '.join(METRIC_RUN)}`) wrote {len(rows)} rows when "
           f"this site was built: {len(train)} columns in its train row, "
           f"{len(evals[0]) if evals else 0} in each eval row.", ""]
    for namespace, what in NAMESPACES.items():
        names = sorted(k for k in seen if _namespace(k) == namespace)
        if not names:
            continue
        out += [f"### `{namespace or 'no prefix'}`", "", _cell(what), "",
                "| column | phase | value in that run |", "|---|---|---|"]
        for name in names:
            row = train if name in train else next(r for r in evals if name in r)
            out.append(f"| `{name}` | {row['phase']} | {_cell(_example(row[name]))} |")
        out.append("")
    # the trainer's statistics reach the row under trainer/ (step_metrics); a key the code
    # emits that the run above did not is written only under some option
    rest = []
    for key, where in sorted(emitted_keys().items()):
        if key in seen or f"trainer/{key}" in seen:
            continue
        name = f"trainer/{key}" if where.startswith("trainer/") else key
        rest.append(f"| `{name}` | `{where}` |")
    if rest:
        out += ["### Only under some options", "",
                "Emitted by the code (found where it writes them) but not by the run above: "
                "they need an option it did not set (a correction, dynamic sampling, a "
                "difficulty filter, several environments).", "",
                "| column | written at |", "|---|---|", *rest, ""]
    return "\n".join(out)
