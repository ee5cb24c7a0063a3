"""Maps the top-level component folders onto `envhub.<component>` (see DESIGN.md, Layout).

pyproject.toml holds the metadata; only the folder mapping lives here, because setuptools'
declarative config cannot discover subpackages under a remapped folder.
"""
from setuptools import find_packages, setup

ROOTS = {
    "envhub": "envhub",
    "envhub.sdk": "sdk",
    "envhub.gateway": "gateway",
    "envhub.envs": "envs",
    "envhub.registry": "registry",
    "envhub.trainer": "trainer",
}

packages = []
for package, folder in ROOTS.items():
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_packages(folder)]

# Data shipped inside packages: the bundled model, built-in environments, templates.
DATA = ["*.json", "*.jsonl", "*.parquet", "*.toml", "*.yaml", "*.md", "*.txt", "*.jinja",
        "*.safetensors", "*.sh", "*.py.tmpl", "py.typed", "**/*"]

setup(packages=packages, package_dir=ROOTS, package_data={p: DATA for p in packages},
      include_package_data=True)
