import sys
from pathlib import Path

EXPECTED = ["a/big.bin", "with space/v.img", "c/just-over.log"]
try:
    got = Path("/app/large.txt").read_text().splitlines()
except OSError as e:
    sys.exit(f"cannot read /app/large.txt: {e}")
if got != EXPECTED:
    sys.exit(f"{got} != {EXPECTED}")
