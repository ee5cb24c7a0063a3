#!/usr/bin/env bash
# The main job on embedded defaults: no API key, no network. Runs the headline environment with
# the bundled tiny model behind an in-process gateway, in the best sandbox available.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh engine,docker
exec .venv/bin/envhub run swe-task "$@"
