import subprocess
import sys
from pathlib import Path

try:
    got = Path("/app/repo/limits.conf").read_text()
except OSError as e:
    sys.exit(f"cannot read limits.conf: {e}")
if got != "threshold = 25\nmode = safe\nretries = 3\n":
    sys.exit(f"wrong content: {got!r}")
# As nobody: the repository's own config (gpg.program with log.showSignature, say) is the
# agent's and may run a program, which as root could rewrite /logs/verifier/reward.txt.
log = subprocess.run(["git", "-C", "/app/repo", "-c", "safe.directory=*", "log", "--format=%s"],
                     capture_output=True, text=True, check=False, user=65534, group=65534,
                     extra_groups=[], env={"PATH": "/usr/bin:/bin", "HOME": "/nonexistent",
                                           "GIT_CONFIG_NOSYSTEM": "1"}).stdout.split("\n")
if log[:3] != ["remove limits", "tune limits", "initial"]:
    sys.exit(f"history was rewritten: {log}")
