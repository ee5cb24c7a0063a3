import subprocess
import sys

build = subprocess.run(["sh", "/app/build.sh"], capture_output=True, text=True, check=False)
if build.returncode != 0:
    sys.exit(f"build.sh failed: {build.stderr[-500:]}")
for args, want in ((["add", "2", "3"], "5"), (["mul", "2", "3", "4"], "24"),
                   (["add", "10", "-4", "1"], "7")):
    run = subprocess.run([sys.executable, "/app/dist/calc.pyz", *args], capture_output=True,
                         text=True, check=False)
    if run.returncode != 0 or run.stdout.strip() != want:
        sys.exit(f"calc.pyz {' '.join(args)}: {run.stdout.strip()!r} {run.stderr[-300:]}")
