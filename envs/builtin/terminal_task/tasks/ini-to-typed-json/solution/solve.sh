#!/bin/bash
set -euo pipefail
python3 - <<'PY'
import configparser, json, re
BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
def typed(v):
    if v.lower() in BOOLS:
        return BOOLS[v.lower()]
    if re.fullmatch(r"[+-]?\d+", v):
        return int(v)
    if re.fullmatch(r"[+-]?\d*\.\d+", v):
        return float(v)
    return v
cp = configparser.ConfigParser()
cp.read("/app/conf/settings.ini")
json.dump({s: {k: typed(v) for k, v in cp[s].items()} for s in cp.sections()},
          open("/app/conf/settings.json", "w"), indent=2)
PY
