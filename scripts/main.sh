#!/usr/bin/env bash
# The main job on embedded defaults: no API key, no network. Runs the headline environment with
# the bundled tiny model behind an in-process gateway, in the best sandbox available.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh engine,docker
# four tasks by default (a full pass over all 30 with the tiny CPU model takes ~40 min);
# flags given here override it, e.g. `bash scripts/main.sh -n 30`
exec .venv/bin/envhub run swe-task -n 4 "$@"
