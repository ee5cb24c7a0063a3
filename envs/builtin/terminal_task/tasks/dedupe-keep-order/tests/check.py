import sys
from pathlib import Path

EXPECTED = ["apple", "Banana", "cherry", "Date", "elderberry", "fig"]
try:
    got = Path("/app/unique.txt").read_text().splitlines()
except OSError as e:
    sys.exit(f"cannot read /app/unique.txt: {e}")
if got != EXPECTED:
    sys.exit(f"{got} != {EXPECTED}")
