#!/usr/bin/env bash
# Issue 28's GPU checks and figures in one run, for a machine with one CUDA GPU and the
# system's torch (run from the repository root; nothing here runs in CI). Each step has its
# own time limit and a failure does not stop the next; everything printed also goes to
# ${OUT:-/tmp}/gpu_checks.log.
#
#   bash bench/gpu_checks.sh            # ~8 min on an H100/H200
#
# Where envhub's own dependencies are missing (pydantic, fastapi, sqlalchemy, ...), carry them
# as wheels in .whl/ and they are installed into /tmp/site first (see ../shared/GPU.md).
set -uo pipefail
cd "$(dirname "$0")/.."
log=${OUT:-/tmp}/gpu_checks.log
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
step() {  # seconds, label, command...
  local limit=$1 label=$2
  shift 2
  echo "== $label: $*" | tee -a "$log"
  timeout "$limit" "$@" 2>&1 | tee -a "$log"
  echo "== $label: exit ${PIPESTATUS[0]}" | tee -a "$log"
}
nvidia-smi --query-gpu=name,memory.total --format=csv | tee -a "$log"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', \
transformers.__version__)" | tee -a "$log"
# Tree vs naive in fp32 within 1e-5, logprobs and gradients, every path (flex with backward).
step 120 exactness python3 bench/bench_prefix_tree.py --check --device cuda
# The issue's workload (token bound 3.33x), then one with almost no sharing (auto: unmerged).
step 120 shared-prefix python3 bench/bench_prefix_tree.py --device cuda --dtype bf16 \
  --hidden 1024 --layers 4 --workload shared --shared 2048 --own 512 --budgets 32768 --reps 3
step 90 little-sharing python3 bench/bench_prefix_tree.py --device cuda --dtype bf16 \
  --hidden 1024 --layers 4 --workload shared --shared 32 --own 512 --budgets 32768 --reps 3
step 90 group python3 bench/bench_prefix_tree.py --device cuda --dtype bf16 --reps 3
step 120 trainer python3 bench/bench_trainer_throughput.py --model wide --groups 4 --steps 2
# Grouped speculative decoding on the GPU (the bundled model, arith groups of 8).
step 90 speculative python3 bench/bench_speculative.py --device cuda --groups 4 --repeats 3
# --device cpu on a machine with a GPU: nothing touches CUDA.
step 90 device-cpu python3 -m pytest -q -p no:cacheprovider tests/trainer/test_device_dtype.py
