#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import csv, json
users = sorted(json.load(open("/app/data/users.json")), key=lambda u: u["id"])
with open("/app/users.csv", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["id", "name", "city", "active"])
    for u in users:
        w.writerow([u["id"], u["name"], (u.get("address") or {}).get("city", ""),
                    "yes" if u["active"] else "no"])
PY
