"""`rg:NAME[key=value,...]`: which reasoning-gym dataset, how many tasks, which seed and config.

Parsing is syntax only; `checked` holds the values against the installed reasoning-gym (the
dataset exists, every key is a field of its config, each value has the field's type, the
config's own `validate()` accepts them). Every failure is an EnvLoadError (exit 2) naming the
fix. reasoning-gym is imported here, lazily: only an rg environment needs it.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from envhub.envs.errors import EnvLoadError

PREFIX = "rg:"
REQUIREMENT = "reasoning-gym>=0.1.25,<0.2"  # the same range as pyproject's extra
INSTALL_HINT = f"pip install 'envhub[reasoning-gym]' (or pip install '{REQUIREMENT}')"
DEFAULT_SIZE, DEFAULT_SEED = 100, 0
DEFAULT_SCORE_TIMEOUT_S = 10.0
MAX_SIZE = 100_000
# keys of the reference that are not config fields; `seed`/`size` are config fields too, but
# set by the reference's own keys; `partial` is how the scorer's value becomes the outcome;
# `score_timeout_s` the scorer's time limit per answer
OWN_KEYS = ("size", "seed", "partial", "score_timeout_s")
EXAMPLES = ("basic_arithmetic", "chain_sum", "leg_counting", "gsm_symbolic", "sudoku")
REF_RE = re.compile(r"^rg:(?P<name>[A-Za-z0-9_]+)(?:\[(?P<body>.*)\])?$", re.S)


@dataclass(frozen=True)
class RGSpec:
    """One reasoning-gym task set: `size` entries of `dataset` generated from `seed` with
    `config` (the dataset's config fields other than seed and size)."""

    dataset: str
    seed: int = DEFAULT_SEED
    size: int = DEFAULT_SIZE
    config: dict[str, Any] = field(default_factory=dict)
    # False (the default): the outcome is 1 for a full score, else 0. Several scorers give
    # len(gold) / len(answer) to any answer that CONTAINS the gold one, which a policy learns
    # to farm by answering "0 1 2 3 4 5 6 7 8 9"; True passes the scorer's partial credit on.
    partial: bool = False
    # seconds the scorer may take on one answer (an overrun is ungradable: 0 with a signal)
    score_timeout_s: float = DEFAULT_SCORE_TIMEOUT_S

    @property
    def key(self) -> str:
        """A hashable identity (the dataset cache's key)."""
        return json.dumps([self.dataset, self.seed, self.size, self.config], sort_keys=True)

    def metadata(self) -> dict[str, Any]:
        """The manifest's [metadata] for this spec (what `from_metadata` reads back)."""
        return {"dataset": self.dataset, "seed": self.seed, "size": self.size,
                "partial": self.partial, "score_timeout_s": self.score_timeout_s,
                "config": dict(self.config)}

    @classmethod
    def from_metadata(cls, meta: dict[str, Any], where: str = "envhub.toml") -> RGSpec:
        dataset, config = meta.get("dataset"), meta.get("config", {})
        if not isinstance(dataset, str) or not dataset:
            raise EnvLoadError(f"{where}: [metadata] needs dataset = \"NAME\" (a reasoning-gym "
                               "dataset, e.g. \"chain_sum\")")
        if not isinstance(config, dict):
            raise EnvLoadError(f"{where}: [metadata.config] must be a table of config fields")
        values = {"seed": meta.get("seed", DEFAULT_SEED), "size": meta.get("size", DEFAULT_SIZE)}
        for key, value in values.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise EnvLoadError(f"{where}: [metadata] {key} must be a whole number, got "
                                   f"{value!r}")
        partial = meta.get("partial", False)
        if not isinstance(partial, bool):
            raise EnvLoadError(f"{where}: [metadata] partial must be true or false, got "
                               f"{partial!r}")
        timeout = _timeout(meta.get("score_timeout_s", DEFAULT_SCORE_TIMEOUT_S),
                           f"{where}: [metadata] score_timeout_s")
        return checked(cls(dataset, values["seed"], values["size"], dict(config), partial,
                           timeout), where)


def parse_reference(ref: str) -> RGSpec:
    """`rg:NAME[key=value,...]` as a spec, checked against the installed reasoning-gym."""
    m = REF_RE.match(ref.strip())
    if m is None:
        raise EnvLoadError(f"{ref}: write rg:NAME or rg:NAME[key=value,...], e.g. "
                           "rg:chain_sum[size=20,seed=3,max_terms=4] (quote it in the shell)")
    options: dict[str, Any] = {}
    for item in _split(m.group("body") or "", ref):
        key, eq, text = item.partition("=")
        key = key.strip()
        if not eq or not key:
            raise EnvLoadError(f"{ref}: '{item}' is not key=value; e.g. size=20")
        if key in options:
            raise EnvLoadError(f"{ref}: '{key}' is given twice; give each setting once")
        options[key] = _value(text.strip())
    size, seed = options.pop("size", DEFAULT_SIZE), options.pop("seed", DEFAULT_SEED)
    for key, value in (("size", size), ("seed", seed)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise EnvLoadError(f"{ref}: {key}={value!r}: give a whole number, e.g. {key}=20")
    partial = options.pop("partial", False)
    if not isinstance(partial, bool):
        raise EnvLoadError(f"{ref}: partial={partial!r}: give partial=true or partial=false")
    timeout = _timeout(options.pop("score_timeout_s", DEFAULT_SCORE_TIMEOUT_S),
                       f"{ref}: score_timeout_s")
    return checked(RGSpec(m.group("name"), seed, size, options, partial, timeout), ref)


def _timeout(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or \
            not 0 < value <= 3600:
        raise EnvLoadError(f"{where}={value!r}: give seconds from 0 to 3600, e.g. 10")
    return float(value)


def _split(body: str, ref: str) -> list[str]:
    """Split on commas outside brackets and quotes (a list value holds commas of its own)."""
    items, depth, quoted, start = [], 0, False, 0
    for i, ch in enumerate(body):
        if ch == '"' and (i == 0 or body[i - 1] != "\\"):
            quoted = not quoted
        elif not quoted and ch in "[{":
            depth += 1
        elif not quoted and ch in "]}":
            depth -= 1
        elif not quoted and depth == 0 and ch == ",":
            items.append(body[start:i])
            start = i + 1
    if depth or quoted:
        raise EnvLoadError(f"{ref}: unbalanced brackets or quotes in the settings")
    items.append(body[start:])
    return [item.strip() for item in items if item.strip()]


def _value(text: str) -> Any:
    """A JSON literal (number, true/false, list, "quoted text"), else the text as it is."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def require_reasoning_gym() -> Any:
    """The reasoning_gym module; EnvLoadError with the install command when it is missing."""
    try:
        import reasoning_gym
    except ImportError as e:
        raise EnvLoadError(f"reasoning-gym environments need the reasoning-gym package, which "
                           f"is not installed ({e}); {INSTALL_HINT}") from None
    return reasoning_gym


def dataset_names() -> list[str]:
    require_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    return sorted(DATASETS)


def config_fields(dataset: str) -> dict[str, Any]:
    """Field name → default of a dataset's config (its difficulty settings and more)."""
    require_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    if dataset not in DATASETS:
        close = difflib.get_close_matches(dataset.lower(), DATASETS, n=6, cutoff=0.5)
        raise EnvLoadError(f"rg:{dataset}: reasoning-gym has no dataset '{dataset}'; "
                           f"{'did you mean ' + ', '.join(close) + '? ' if close else ''}"
                           f"e.g. {', '.join(EXAMPLES)} ({len(DATASETS)} in all: "
                           "python -c 'from reasoning_gym.factory import DATASETS; "
                           "print(sorted(DATASETS))')")
    fields = {}
    for f in dataclasses.fields(DATASETS[dataset][1]):
        if f.default is not dataclasses.MISSING:
            fields[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            fields[f.name] = f.default_factory()
        else:
            fields[f.name] = None
    return fields


def checked(spec: RGSpec, where: str) -> RGSpec:
    """The spec with each value coerced to its config field's type; EnvLoadError otherwise."""
    fields = config_fields(spec.dataset)
    if not 1 <= spec.size <= MAX_SIZE:
        raise EnvLoadError(f"{where}: size={spec.size}: give 1 to {MAX_SIZE} tasks")
    if not 0 <= spec.seed < 2**32:
        raise EnvLoadError(f"{where}: seed={spec.seed}: give a seed from 0 to 2**32 - 1")
    settable = {k: v for k, v in fields.items() if k not in OWN_KEYS}
    config = {}
    for key, value in spec.config.items():
        if key not in settable:
            raise EnvLoadError(f"{where}: '{key}' is not a setting of {spec.dataset}; use size, "
                               f"seed or one of its config fields: {_describe(settable)}")
        config[key] = _coerced(key, value, settable[key], where)
    spec = RGSpec(spec.dataset, spec.seed, spec.size, config, spec.partial,
                  spec.score_timeout_s)
    dataset(spec, where)  # the config's own validate() and the generator's constructor
    return spec


def _coerced(key: str, value: Any, default: Any, where: str) -> Any:
    """`value` in the type of the field's default (a list for a tuple field, a float for an int
    given to a float field); a field without a typed default takes a JSON scalar or list."""
    def bad(kind: str) -> EnvLoadError:
        return EnvLoadError(f"{where}: {key}={json.dumps(value)}: {key} takes {kind} (default "
                            f"{json.dumps(default, default=str)})")

    if isinstance(value, float) and not math.isfinite(value):
        raise bad("a finite number")
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise bad("true or false")
    elif isinstance(default, int):
        if not isinstance(value, int) or isinstance(value, bool):
            raise bad("a whole number")
    elif isinstance(default, float):
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise bad("a number")
        value = float(value)
    elif isinstance(default, str):
        if not isinstance(value, str):
            raise bad("text")
    elif isinstance(default, list | tuple):
        if not isinstance(value, list):
            raise bad('a list, e.g. ["a","b"]')
    elif default is not None:
        raise bad("no value settable here (its default is not a number, text or list)")
    if not isinstance(value, str | int | float | bool | list):
        raise bad("a number, true/false, text or a list")
    return value


def _describe(fields: dict[str, Any]) -> str:
    return ", ".join(f"{k} (default {json.dumps(v, default=str)})" for k, v in fields.items())


def dataset(spec: RGSpec, where: str = "") -> Any:
    """The reasoning-gym dataset object of a spec (built once per process per spec)."""
    try:
        return _dataset(spec.key)
    except EnvLoadError:
        raise
    except Exception as e:  # the config's validate() asserts; constructors raise anything
        raise EnvLoadError(f"{where or 'rg:' + spec.dataset}: reasoning-gym refused the settings "
                           f"{json.dumps(spec.config)}: {type(e).__name__}: {e}; fix or drop "
                           "them") from None


@lru_cache(maxsize=16)
def _dataset(key: str) -> Any:
    name, seed, size, config = json.loads(key)
    fields = config_fields(name)
    # tuple-typed fields (ranges) take the list a reference or TOML gives as a tuple
    config = {k: tuple(v) if isinstance(fields.get(k), tuple) else v for k, v in config.items()}
    return require_reasoning_gym().create_dataset(name, seed=seed, size=size, **config)


def tag(spec: RGSpec) -> str:
    """"" for a dataset's default settings (any seed and size), else a short digest of the
    settings that differ, so two references to one dataset get distinct names and task ids."""
    defaults = config_fields(spec.dataset)

    def same(key: str, value: Any) -> bool:
        default = defaults.get(key)
        return value == (list(default) if isinstance(default, tuple) else default)

    changed = {k: v for k, v in spec.config.items() if not same(k, v)}
    if not changed and not spec.partial:
        return ""
    text = json.dumps([changed, spec.partial], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:8]
