import sys
from pathlib import Path

EXPECTED = 'search 19\nmailer 18\nbilling 16\nauth 14'
try:
    got = Path("/app/report.txt").read_text().strip()
except OSError as e:
    sys.exit(f"cannot read /app/report.txt: {e}")
if got != EXPECTED:
    sys.exit(f"report differs:\n{got}\n--- expected ---\n{EXPECTED}")
