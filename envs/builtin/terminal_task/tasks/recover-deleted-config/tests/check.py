import subprocess
import sys
from pathlib import Path

try:
    got = Path("/app/repo/limits.conf").read_text()
except OSError as e:
    sys.exit(f"cannot read limits.conf: {e}")
if got != "threshold = 25\nmode = safe\nretries = 3\n":
    sys.exit(f"wrong content: {got!r}")
log = subprocess.run(["git", "-C", "/app/repo", "-c", "safe.directory=*", "log", "--format=%s"],
                     capture_output=True, text=True, check=False).stdout.split("\n")
if log[:3] != ["remove limits", "tune limits", "initial"]:
    sys.exit(f"history was rewritten: {log}")
