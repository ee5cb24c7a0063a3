#!/bin/bash
set -euo pipefail
python3 - <<'PY'
seen, out = set(), []
for line in open("/app/data/words.txt"):
    word = line.strip()
    if word and word.lower() not in seen:
        seen.add(word.lower())
        out.append(word)
open("/app/unique.txt", "w").write("\n".join(out) + "\n")
PY
