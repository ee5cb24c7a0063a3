"""Curves of `envhub train` runs: every numeric series of OUT/metrics.jsonl, grouped into
charts a researcher reads at a glance, drawn by matplotlib as SVG on the server (no script,
nothing fetched: the page stays under the viewer's Content-Security-Policy).

Charts, in this order (a chart is drawn only when its series are in the file):
  reward        reward_mean, resolved_rate, outcome_mean and each environment's
  held-out eval eval/* rows, at the step they were evaluated after (-1: before the first)
  loss, policy  trainer/loss/*, entropy and the KL estimates
  IS            the importance-sampling mask's masked fraction and ratio range
  staleness     samples dropped as stale, version lag (mean, max), mixed-version samples
  throughput    rollouts/min and trained tokens/s (from each row's counts and times)
  mix           each environment's share of trained samples
  times         rollout (wait), train and push seconds per step
  then every other numeric series, by its first name part (filter/, trainer/, mix/, ...).

A series longer than MAX_POINTS is drawn as the means of MAX_POINTS equal buckets of steps (the
chart says so); shorter ones are drawn point for point. Each line is an SVG group whose id
names the run and series (`series-R-K`: R the run's index on the page, K the series'), and
each chart's group id carries its axes' data limits (`axes-...`), so what is drawn can be read
back from the page."""

from __future__ import annotations

import io
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_POINTS = 1000
STYLES = ("-", "--", ":", "-.")  # one per run on a compare page

Series = dict[str, list[tuple[float, float]]]  # key -> (x, y) points


@dataclass
class Chart:
    title: str
    keys: list[str]
    note: str = ""
    svg: str = ""
    series: list[tuple[int, str, list[tuple[float, float]]]] = field(default_factory=list)


def read_metrics(folder: Path) -> list[dict[str, Any]]:
    """The rows of `folder`/metrics.jsonl (a line being written, or torn, left out)."""
    try:
        text = (folder / "metrics.jsonl").read_text(encoding="utf-8")
    except OSError:
        return []
    return _rows(text.splitlines())


SAMPLES_SHOWN = 12  # the newest sample rollouts on a run's page
TAIL_BYTES = 1 << 20  # read of samples.jsonl's end, at most


def read_samples(folder: Path) -> list[dict[str, Any]]:
    """The newest rows of `folder`/samples.jsonl (a few rollouts of each step: agent text,
    shown escaped), read from the file's last MiB."""
    path = folder / "samples.jsonl"
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            tail = f.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = tail.splitlines()[1:] if size > TAIL_BYTES else tail.splitlines()
    return _rows(lines[-SAMPLES_SHOWN:])


def _rows(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The JSON objects among `lines` (a line being written, or torn, left out)."""
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def series_of(rows: list[dict[str, Any]]) -> Series:
    """Every numeric series: train rows by `step`, eval rows (`eval/...` keys) by
    `after_step`, and the derived rollouts/min and tokens/s."""
    out: Series = {}
    last_wall: float | None = None
    for row in rows:
        phase = row.get("phase")
        x = _number(row.get("step" if phase == "train" else "after_step"))
        if x is None or phase not in ("train", "eval"):
            continue
        for key, value in row.items():
            y = _number(value)
            if y is None or key in ("step", "after_step"):
                continue
            if phase == "eval" and not key.startswith("eval/"):
                continue
            out.setdefault(key, []).append((x, y))
        if phase != "train":
            continue
        wall = _number(row.get("wall_s"))
        rollouts, tokens, train_s = (_number(row.get(k)) for k in (
            "rollouts", "trainer/tokens/packed", "train_s"))
        if wall is not None and last_wall is not None and wall > last_wall and rollouts:
            out.setdefault("rollouts/min", []).append((x, rollouts * 60 / (wall - last_wall)))
        if tokens is not None and train_s:
            out.setdefault("tokens/s", []).append((x, tokens / train_s))
        last_wall = wall
    return out


# (title, which keys); a key goes to the first chart that takes it
GROUPS: list[tuple[str, Callable[[str], bool]]] = [
    ("reward", lambda k: k in ("reward_mean", "resolved_rate", "outcome_mean")
     or bool(re.fullmatch(r"env/[^/]+/(reward_mean|resolved_rate)", k))),
    ("held-out evaluation", lambda k: k in ("eval/reward_mean", "eval/resolved_rate")),
    ("loss", lambda k: k.startswith("trainer/loss/") and k != "trainer/loss/tokens"),
    ("policy: entropy and KL", lambda k: k == "trainer/policy/entropy"
     or k.startswith("trainer/kl/")),
    ("importance sampling", lambda k: k in ("trainer/is/masked_fraction", "trainer/is/ratio_min",
                                            "trainer/is/ratio_max", "trainer/is/ratio_mean")),
    ("rollout correction", lambda k: k.startswith("trainer/correction/")),
    ("staleness", lambda k: k in ("filter/stale", "staleness/mean", "staleness/max",
                                  "versions/mixed_samples")),
    ("throughput", lambda k: k in ("rollouts/min", "tokens/s")),
    ("trained share per environment", lambda k: bool(re.fullmatch(r"mix/[^/]+/trained_share", k))),
    ("seconds per step", lambda k: k in ("rollout_s", "train_s", "push_s")),
    ("weights", lambda k: k in ("weight_version", "staleness/lag")),
]


def charts_for(keys: Iterable[str]) -> list[Chart]:
    """The charts that draw `keys`, every key in exactly one."""
    left = sorted(set(keys))
    charts = []
    for title, takes in GROUPS:
        mine = [k for k in left if takes(k)]
        if mine:
            charts.append(Chart(title, mine))
            left = [k for k in left if k not in mine]
    by_prefix: dict[str, list[str]] = {}
    for k in left:
        by_prefix.setdefault(k.split("/", 1)[0] if "/" in k else "other", []).append(k)
    for prefix, mine in sorted(by_prefix.items()):
        for i in range(0, len(mine), 6):  # at most six lines a chart
            charts.append(Chart(prefix, mine[i:i + 6]))
    return charts


def _buckets(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    if len(points) <= MAX_POINTS:
        return points
    size = len(points) / MAX_POINTS
    out = []
    for b in range(MAX_POINTS):
        part = points[int(b * size):int((b + 1) * size)] or [points[int(b * size)]]
        out.append((sum(x for x, _ in part) / len(part), sum(y for _, y in part) / len(part)))
    return out


def _safe_id(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text)


def _fmt(v: float) -> str:
    return repr(float(v))


def render(runs: list[tuple[str, list[dict[str, Any]]]]) -> list[Chart]:
    """The charts of one run, or of several overlaid (`runs`: (name, rows) each), with their
    SVG drawn."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    all_series = [series_of(rows) for _, rows in runs]
    charts = charts_for(k for s in all_series for k in s)
    rc: dict[str, Any] = {"svg.fonttype": "none", "svg.hashsalt": "envhub", "path.simplify": False,
          "font.size": 9, "axes.titlesize": 10, "legend.fontsize": 8}
    with matplotlib.rc_context(rc):  # type: ignore[arg-type]
        for chart in charts:
            fig = Figure(figsize=(5.6, 2.9), dpi=100, layout="constrained")
            ax = fig.add_subplot()
            for r, ((name, _), series) in enumerate(zip(runs, all_series, strict=True)):
                for c, key in enumerate(chart.keys):
                    points = series.get(key)
                    if not points:
                        continue
                    drawn = _buckets(points)
                    if len(drawn) < len(points):
                        chart.note = f"series over {MAX_POINTS} points: means of " \
                                     f"{MAX_POINTS} buckets of steps"
                    chart.series.append((r, key, drawn))
                    label = key if len(runs) == 1 else f"{name} · {key}"
                    ax.plot([x for x, _ in drawn], [y for _, y in drawn], label=label,
                            color=f"C{c % 10}", linestyle=STYLES[r % len(STYLES)],
                            marker="." if len(drawn) <= 60 else None, linewidth=1.4,
                            gid=f"series-{r}-{_safe_id(key)}")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
            ax.set_title(chart.title)
            ax.set_xlabel("step (eval: after step)" if chart.title.startswith("held-out")
                          else "step")
            ax.grid(True, linewidth=0.4, alpha=0.5)
            if len(runs) == 1:
                ax.legend(loc="best", frameon=False)
            else:  # run x series lines: the legend below the plot, not over it
                fig.set_size_inches(5.6, 2.9 + 0.16 * len(chart.series))
                ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncols=2,
                          frameon=False)
            (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
            ax.patch.set_gid(f"axes-{_fmt(x0)}_{_fmt(x1)}_{_fmt(y0)}_{_fmt(y1)}")
            buf = io.StringIO()
            fig.savefig(buf, format="svg")
            chart.svg = _inline(buf.getvalue())
    return charts


def _inline(svg: str) -> str:
    """The <svg> element alone (no XML declaration or doctype), to sit inside the page."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg
