import sys
from pathlib import Path

EXPECTED = ['the 7', 'dog 3', 'fox 3', 'a 2', 'and 1']
try:
    got = Path("/app/top.txt").read_text().split("\n")
except OSError as e:
    sys.exit(f"cannot read /app/top.txt: {e}")
if [g for g in got if g.strip()] != EXPECTED:
    sys.exit(f"{got} != {EXPECTED}")
