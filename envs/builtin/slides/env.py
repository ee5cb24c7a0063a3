"""`slides`: write an HTML slide deck for a brief; graded by rendering it in Chromium.

The agent writes one HTML file per slide (`write_slide`) into the rollout's sandbox, may ask
for the grader's layout report while it works (`check_slides`: rendered in that sandbox), and
submits. The agent's HTML is never rendered on the host: the verifier copies the deck into a
fresh sandbox (local bubblewrap or docker, no network) and renders each slide there in a real
Chromium (render.py: JavaScript off, every request refused), then scores the layout checks
of layout.py on the host from what the render shows (on-screen sizes, and required phrases
judged from the pixels their glyphs change). The outcome is the share of required phrases shown
times the mean of the layout checks (resolved: all pass); each failed check is also a process
signal `layout_<check>` worth 1 - score, weighted by the manifest's `process.layout_<check>`.
A deck that breaks the grader's browser (crashes or hangs it) in two fresh sandboxes in a row
while a blank slide renders scores 0 with the `ungradable_output` signal; a failure that does
not repeat is the grader's (graded from the retry, counted in info's `grader_retries`);
env_failure only when the browser fails on its own.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from envhub.envs.browser.chromium import BrowserUnavailable
from envhub.envs.browser.sandbox import browser_spec, resolved_kind
from envhub.envs.builtin.slides.layout import CHECKS, Brief, LayoutReport, score_deck
from envhub.envs.builtin.slides.render import (
    CLOSE_S,
    LAUNCH_TIMEOUT_S,
    MAX_SLIDE_BYTES,
    RENDER_TIMEOUT_MS,
    Measurement,
    render_deck,
)
from envhub.envs.environment import (
    UNGRADABLE,
    EnvFailure,
    RunContext,
    Task,
    ToolResult,
    Verdict,
)
from envhub.envs.loader import task_rows
from envhub.envs.manifest import Manifest, SandboxSpec
from envhub.envs.sandbox.base import Sandbox
from envhub.envs.sandbox.errors import FileTooLarge, SandboxError, SandboxFileError
from envhub.envs.tools.arguments import json_object
from envhub.sdk.types import Signal

SLIDES_DIR = "/workspace/slides"
MAX_SLIDES = 20
# the grader's own slide, rendered when the agent's deck broke the browser: tells whose fault
BLANK_SLIDE = "<!doctype html><html><body><p>envhub</p></body></html>"
# renders of the deck, each in a fresh sandbox, that must all fail before the deck is blamed
GRADER_ATTEMPTS = 2

INSTRUCTION = """Write a slide deck as HTML, one file per slide.

Brief: {brief}

Requirements:
- exactly {count} slides, each a complete HTML document rendered at {width}x{height} pixels;
- everything must fit on the slide: no content beyond the edges, no text cut off by a box
  that is too small, no text drawn over other text;
- no text smaller than {min_font}px;
- the deck must show these phrases: {required}.
Only HTML and CSS count (scripts do not run, nothing is loaded from the network).
Write each slide with write_slide, check the layout with check_slides, then call submit."""

SCHEMAS: dict[str, dict[str, Any]] = {
    "write_slide": {"type": "function", "function": {
        "name": "write_slide",
        "description": "Write (or overwrite) one slide as a complete HTML document.",
        "parameters": {"type": "object", "properties": {
            "number": {"type": "integer", "description": "slide number, from 1"},
            "html": {"type": "string", "description": "the slide's HTML (inline CSS)"}},
            "required": ["number", "html"]},
    }},
    "check_slides": {"type": "function", "function": {
        "name": "check_slides",
        "description": "Render the slides written so far and report every layout problem "
                       "the grader would find.",
        "parameters": {"type": "object", "properties": {}, "required": []},
    }},
}


def slide_path(number: int) -> str:
    return f"{SLIDES_DIR}/slide{number}.html"


class SlidesEnv:
    def __init__(self, folder: Path, manifest: Manifest) -> None:
        self.folder = Path(folder)
        self.manifest = manifest
        self.solutions = self.folder / str(manifest.metadata.get("solutions_dir",
                                                                  "data/solutions"))

    def load_tasks(self) -> list[Task]:
        tasks = []
        for row in task_rows(self.folder, self.manifest.tasks):
            brief = brief_of(row)
            tasks.append(Task(id=str(row["id"]), data=row, instruction=INSTRUCTION.format(
                brief=row["brief"], count=brief.slide_count, width=brief.width,
                height=brief.height, min_font=f"{brief.min_font_px:g}",
                required=", ".join(f'"{p}"' for p in brief.required) or "(none)")))
        return tasks

    async def setup(self, task: Task, ctx: RunContext) -> Sandbox:
        return await ctx.open_sandbox(await self.spec(ctx))

    async def spec(self, ctx: RunContext) -> SandboxSpec:
        """The manifest's spec for a sandbox that runs Chromium (docker: the browser image)."""
        try:
            return await browser_spec(self.manifest.sandbox, resolved_kind(ctx.sandbox_kind))
        except BrowserUnavailable as e:
            raise EnvFailure(str(e)) from None

    def tools(self, task: Task) -> list[str]:
        return list(self.manifest.tools)

    def tool_schemas(self, task: Task) -> list[dict[str, Any]]:
        return [SCHEMAS[name] for name in self.tools(task) if name in SCHEMAS]

    async def call_tool(self, task: Task, name: str, arguments: str, sandbox: Sandbox,
                        state: dict[str, Any]) -> ToolResult:
        if name == "check_slides":
            return ToolResult((await self.report(task, sandbox)).summary())
        args = json_object(name, arguments, '{"number": 1, "html": "<html>...</html>"}')
        if isinstance(args, ToolResult):
            return args
        number, html = args.get("number"), args.get("html")
        if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= MAX_SLIDES:
            return ToolResult(f"`number` must be a whole number from 1 to {MAX_SLIDES}",
                              is_error=True)
        if not isinstance(html, str) or not html.strip():
            return ToolResult("`html` must be the slide's HTML document (a string)",
                              is_error=True)
        if len(html.encode()) > MAX_SLIDE_BYTES:
            return ToolResult(f"a slide may hold at most {MAX_SLIDE_BYTES >> 10} KiB of HTML",
                              is_error=True)
        await sandbox.write_file(slide_path(number), html.encode())
        return ToolResult(f"wrote slide {number}")

    async def solve(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> None:
        folder = self.solutions / task.id
        files = sorted(folder.glob("slide*.html"), key=lambda p: int(p.stem[5:]))
        if not files:
            raise EnvFailure(f"{task.id}: no gold slides in {folder}")
        for path in files:
            await sandbox.write_file(f"{SLIDES_DIR}/{path.name}", path.read_bytes())

    async def report(self, task: Task, sandbox: Sandbox,
                     render_in: Sandbox | None = None) -> LayoutReport:
        """The layout report of the deck in `sandbox`, rendered in `render_in` (default: the
        same sandbox)."""
        brief = brief_of(task.data)
        return score_deck(await render(await read_deck(sandbox), brief, render_in or sandbox),
                          brief)

    def verify_budget_s(self, task: Task) -> float:
        """GRADER_ATTEMPTS renders of the whole deck, the blank-slide control, and the
        sandboxes they open (environment.GradingBudget)."""
        deck = LAUNCH_TIMEOUT_S + MAX_SLIDES * (RENDER_TIMEOUT_MS / 1000 + CLOSE_S)
        control = LAUNCH_TIMEOUT_S + RENDER_TIMEOUT_MS / 1000 + CLOSE_S
        opens = (GRADER_ATTEMPTS + 1) * self.manifest.sandbox.setup_timeout_s
        return GRADER_ATTEMPTS * deck + control + opens

    async def verify(self, task: Task, sandbox: Sandbox, ctx: RunContext) -> Verdict:
        """Graded in a fresh sandbox holding only a copy of the deck: whatever rendering the
        agent's slides did during the rollout (check_slides) cannot touch the grader's browser.
        A render that fails is done again in another fresh sandbox before anyone is blamed (a
        loaded machine makes Chromium fail now and then: a screenshot refused, a page slow past
        its deadline); a failure that does not repeat is graded from the retry."""
        brief = brief_of(task.data)
        try:
            htmls = await read_deck(sandbox)
        except (EnvFailure, SandboxError) as e:
            return Verdict(0.0, False, env_failure=str(e))
        failures: list[str] = []
        while True:
            try:
                slides, failed = await self.render_fresh(htmls, brief, ctx)
            except (EnvFailure, SandboxError) as e:  # no sandbox to grade in: ours
                return Verdict(0.0, False, {"grader_retries": len(failures)},
                               env_failure=str(e))
            if failed is None:
                break
            failures.append(failed)
            if len(failures) == GRADER_ATTEMPTS:
                return await self.blame(failures, brief, ctx)
        report = score_deck(slides, brief)
        signals = [Signal(name=f"layout_{check}", value=1.0 - report.scores[check],
                          info={"details": report.details[check]})
                   for check in CHECKS if report.scores[check] < 1.0]
        info: dict[str, Any] = {"checks": report.scores, "details": report.details,
                                "grader_retries": len(failures)}
        if failures:
            info["grader_failures"] = failures  # did not repeat: the grader's, not the deck's
        return Verdict(report.outcome, report.passed, info, signals=signals)

    async def render_fresh(self, htmls: list[str | None], brief: Brief, ctx: RunContext
                           ) -> tuple[list[Measurement], str | None]:
        """The deck rendered in a sandbox opened for it alone, and what failed there (None when
        every slide rendered). Opening the sandbox failing raises."""
        fresh = await ctx.open_sandbox(await self.spec(ctx))
        try:
            slides = await render(htmls, brief, fresh)
            return slides, next((f"slide {i}: {m.error}" for i, m in enumerate(slides, 1)
                                 if m.broke), None)
        except (EnvFailure, SandboxError) as e:
            return [], str(e)
        finally:
            await fresh.close()

    async def blame(self, failures: list[str], brief: Brief, ctx: RunContext) -> Verdict:
        """The browser failed on the agent's deck in each of GRADER_ATTEMPTS fresh sandboxes
        (died, or a slide hung or crashed its page): a blank slide of the grader's own,
        rendered the same way in another fresh sandbox, tells whose fault. It renders: the deck
        broke the browser (0, ungradable_output). It fails too: the infrastructure
        (env_failure)."""
        error, info = failures[-1], {"grader_retries": len(failures) - 1,
                                     "grader_failures": failures}
        try:
            probe = await ctx.open_sandbox(await self.spec(ctx))
            try:
                deck = await render_deck(probe, [BLANK_SLIDE], brief.width, brief.height)
            finally:
                await probe.close()
        except (EnvFailure, SandboxError) as e:
            return Verdict(0.0, False, info,
                           env_failure=f"{error} (a blank slide fails too: {e})")
        if deck.slides[0].error:
            return Verdict(0.0, False, info, env_failure=f"{error} (a blank slide fails too: "
                                                         f"{deck.slides[0].error})")
        why = (f"the deck broke the grader's browser {len(failures)} times in fresh sandboxes, "
               f"which render a blank slide: {error}")
        return Verdict(0.0, False, {"ungradable": why, **info},
                       signals=[Signal(name=UNGRADABLE, info={"error": why})])


async def render(htmls: list[str | None], brief: Brief, render_in: Sandbox
                 ) -> list[Measurement]:
    """`htmls` measured in `render_in` at the brief's size, with where its phrases show; no
    slides: nothing to measure (every check fails) and no browser started."""
    if not htmls:
        return []
    return (await render_deck(render_in, htmls, brief.width, brief.height,
                              brief.required)).slides


async def read_deck(sandbox: Sandbox) -> list[str | None]:
    """slide1.html, slide2.html, ... in order, up to the first number that is missing; None for
    a slide larger than MAX_SLIDE_BYTES (not read: it fails its checks)."""
    htmls: list[str | None] = []
    for number in range(1, MAX_SLIDES + 1):
        try:
            data = await sandbox.read_file(slide_path(number), limit=MAX_SLIDE_BYTES)
        except FileTooLarge:
            htmls.append(None)
            continue
        except SandboxFileError:
            break
        htmls.append(data.decode(errors="replace"))
    return htmls


def brief_of(row: dict[str, Any]) -> Brief:
    """The task row's brief; a row missing fields is a bad task file (KeyError names it)."""
    try:
        return Brief(slide_count=int(row["slide_count"]), width=int(row.get("width", 1280)),
                     height=int(row.get("height", 720)),
                     min_font_px=float(row.get("min_font_px", 18)),
                     required=[str(p) for p in row.get("required", [])])
    except (KeyError, TypeError, ValueError) as e:
        raise ValueError(f"slides task {row.get('id')!r}: bad brief ({e!r}); rows need "
                         f"slide_count and may set width, height, min_font_px, required: "
                         f"{json.dumps(row)[:200]}") from None
