"""`envhub init`: a runnable environment package from the template in `template/`.

Template files end in `.tmpl` and use `$$name` placeholders (string.Template); `$$$$` is a
literal dollar sign.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from string import Template

from envhub.envs.errors import RunConfigError
from envhub.envs.manifest import NAME_RE

TEMPLATE = Path(__file__).resolve().parent / "template"


def scaffold(target: Path, name: str | None = None) -> Path:
    """Write a new environment package into `target` (created; must not exist or be empty).
    The package name defaults to the folder name. Returns the folder."""
    name = target.name if name is None else name
    if not NAME_RE.match(name):
        raise RunConfigError(f"'{name}' is not a valid environment name; use lowercase letters, "
                             "digits, '.', '_' or '-' (at most 64), e.g. `envhub init my-env`")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise RunConfigError(f"{target} already exists and is not empty; choose a new folder")
    target.mkdir(parents=True, exist_ok=True)
    try:
        for source in sorted(TEMPLATE.glob("*.tmpl")):
            text = Template(source.read_text(encoding="utf-8")).substitute(name=name)
            (target / source.name.removesuffix(".tmpl")).write_text(text, encoding="utf-8")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)  # no half-written package
        raise
    return target
