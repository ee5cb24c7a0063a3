import json
import sys
from pathlib import Path

EXPECTED = {
    "server": {"host": "0.0.0.0", "port": 8080, "debug": False, "workers": 4},
    "database": {"url": "postgres://db:5432/app", "pool_size": 10, "timeout": 2.5, "ssl": True},
    "features": {"beta": True, "ratio": 0.25, "name": "release-42"},
}
try:
    got = json.loads(Path("/app/conf/settings.json").read_text())
except (OSError, ValueError) as e:
    sys.exit(f"cannot read settings.json: {e}")
if got != EXPECTED:
    sys.exit(f"{got} != {EXPECTED}")
# bool vs int: json True == 1 in Python, so check types too
for section, values in EXPECTED.items():
    for key, value in values.items():
        if type(got[section][key]) is not type(value):
            sys.exit(f"{section}.{key}: {type(got[section][key]).__name__}, want "
                     f"{type(value).__name__}")
