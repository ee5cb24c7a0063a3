#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import collections, re
words = [w.strip("'") for w in re.findall(r"[A-Za-z']+", open("/app/data/text.txt").read().lower())]
counts = collections.Counter(w for w in words if w)
top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
open("/app/top.txt", "w").write("".join(f"{w} {n}\n" for w, n in top))
PY
