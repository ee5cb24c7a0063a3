#!/bin/bash
set -euo pipefail
python3 - <<'PY'
path = "/app/server.py"
s = open(path).read()
s = s.replace('''            a, b = query["a"][0], query["b"][0]
            return self._send(200, {"sum": a + b})''', '''            try:
                a, b = float(query["a"][0]), float(query["b"][0])
            except (KeyError, ValueError):
                return self._send(400, {"error": "a and b must be numbers"})
            total = a + b
            return self._send(200, {"sum": int(total) if total.is_integer() else total})''')
s = s.replace("sum(values[1:])", "sum(values)")
open(path, "w").write(s)
PY
