#!/bin/bash
set -euo pipefail
mkdir -p /app/out
python3 - <<'PY'
import csv, json
totals = {}
with open("/app/data/sales.csv", newline="") as f:
    for row in csv.DictReader(f):
        totals[row["region"]] = totals.get(row["region"], 0.0) + float(row["amount"])
json.dump({k: round(v, 2) for k, v in sorted(totals.items())}, open("/app/out/totals.json", "w"))
PY
