"""Built-in environments: every sub-folder of this package that holds an `envhub.toml`.

Discovery reads only the manifests (no entrypoint import), so `envhub list` stays fast and a
broken built-in cannot hide the others.
"""

from __future__ import annotations

from pathlib import Path

from envhub.envs.manifest import Manifest, ManifestError, load_manifest

BUILTIN_ROOT = Path(__file__).resolve().parent


def builtin_folders() -> dict[str, Path]:
    """Environment name (from its manifest) → package folder, sorted by name.

    A folder whose manifest does not validate is skipped here; `envhub info <folder>` shows why.
    """
    found: dict[str, Path] = {}
    for child in sorted(BUILTIN_ROOT.iterdir()):
        if not (child / "envhub.toml").is_file():
            continue
        try:
            manifest = load_manifest(child)
        except ManifestError:
            continue
        found[manifest.name] = child
    return dict(sorted(found.items()))


def builtin_manifests() -> dict[str, Manifest]:
    return {name: load_manifest(folder) for name, folder in builtin_folders().items()}
