import json
import sys
from pathlib import Path

EXPECTED = {"east": 48.10, "north": 110.00, "south": 18.00, "west": 25.00}
try:
    got = json.loads(Path("/app/out/totals.json").read_text())
except (OSError, ValueError) as e:
    sys.exit(f"cannot read /app/out/totals.json: {e}")
if set(got) != set(EXPECTED):
    sys.exit(f"regions {sorted(got)} != {sorted(EXPECTED)}")
for region, value in EXPECTED.items():
    if not isinstance(got[region], (int, float)) or abs(got[region] - value) > 0.005:
        sys.exit(f"{region}: {got[region]!r} != {value}")
