#!/bin/bash
set -euo pipefail
cd /app
sed -i 's/^def mul(values)$/def mul(values):/' src/calc/ops.py
sed -i 's/calc.main:run/calc.cli:run/' build.sh
sh build.sh
