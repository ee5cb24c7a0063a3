import subprocess
import sys

# The agent's build script and app run as nobody: as root they could rewrite
# /logs/verifier/reward.txt after this check wrote it. nobody may write /app (dist/, build/).
NOBODY = {"user": 65534, "group": 65534, "extra_groups": []}
subprocess.run(["chown", "-R", "-h", "65534:65534", "/app"], check=True)
build = subprocess.run(["sh", "/app/build.sh"], capture_output=True, text=True, check=False,
                       **NOBODY)
if build.returncode != 0:
    sys.exit(f"build.sh failed: {build.stderr[-500:]}")
for args, want in ((["add", "2", "3"], "5"), (["mul", "2", "3", "4"], "24"),
                   (["add", "10", "-4", "1"], "7")):
    run = subprocess.run([sys.executable, "/app/dist/calc.pyz", *args], capture_output=True,
                         text=True, check=False, **NOBODY)
    if run.returncode != 0 or run.stdout.strip() != want:
        sys.exit(f"calc.pyz {' '.join(args)}: {run.stdout.strip()!r} {run.stderr[-300:]}")
