"""Which rollouts a run makes: tasks allocated across environments by weight, k samples each,
interleaved so a mixed run keeps every environment busy from the start."""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from envhub.envs.environment import Task
from envhub.envs.loader import LoadedEnv

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class RolloutKey:
    env: str
    task_id: str
    sample: int

    @property
    def text(self) -> str:
        return f"{self.env}/{self.task_id}/{self.sample}"

    @property
    def filename(self) -> str:
        return f"{safe(self.env)}__{safe(self.task_id)}__{self.sample}.json"


def safe(text: str) -> str:
    """A file-name-safe form; when characters had to change, a hash of the original keeps two
    different ids (`a/b`, `a_b`) from sharing a file."""
    cleaned = _UNSAFE.sub("_", text)[:100] or "_"
    if cleaned == text:
        return cleaned
    return f"{cleaned}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


@dataclass
class GroupPlan:
    """One task's k samples: a GRPO group."""

    loaded: LoadedEnv
    task: Task
    k: int

    def keys(self) -> list[RolloutKey]:
        return [RolloutKey(self.loaded.name, self.task.id, i) for i in range(self.k)]


def allocate(total: int | None, weights: list[float], available: list[int]) -> list[int]:
    """Tasks per environment: all of them without a total; else proportional to the weights
    (largest remainder), capped by what each environment has, leftovers redistributed."""
    if total is None:
        return list(available)
    counts = [0] * len(weights)
    remaining = min(total, sum(available))
    open_ = [i for i, a in enumerate(available) if a > 0]
    while remaining > 0 and open_:
        wsum = sum(weights[i] for i in open_)
        shares = {i: remaining * weights[i] / wsum for i in open_}
        floors = {i: min(math.floor(shares[i]), available[i] - counts[i]) for i in open_}
        given = sum(floors.values())
        order = sorted(open_, key=lambda i: shares[i] - math.floor(shares[i]), reverse=True)
        for i in order:
            if given >= remaining:
                break
            if floors[i] < available[i] - counts[i]:
                floors[i] += 1
                given += 1
        for i in open_:
            counts[i] += floors[i]
        remaining -= given
        open_ = [i for i in open_ if counts[i] < available[i]]
        if given == 0:
            break
    return counts


def interleave(per_env: list[list[GroupPlan]], weights: list[float]) -> list[GroupPlan]:
    """Merge per-environment group lists so each environment appears at its weighted pace."""
    out: list[GroupPlan] = []
    progress = [0.0] * len(per_env)
    index = [0] * len(per_env)
    while any(index[i] < len(g) for i, g in enumerate(per_env)):
        live = [i for i, g in enumerate(per_env) if index[i] < len(g)]
        i = min(live, key=lambda j: (progress[j], j))
        out.append(per_env[i][index[i]])
        index[i] += 1
        progress[i] += 1.0 / weights[i]
    return out
