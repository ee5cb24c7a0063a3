"""`run_rank` (how a torchrun rank of `envhub train` ends): the exit status is main's, atexit
handlers and non-daemon threads finish first, and the interpreter's teardown, where gloo's
worker threads can abort the process, is skipped."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from envhub.trainer.distributed import run_rank

        out = Path({str(tmp_path)!r})
        atexit.register(lambda: (out / "atexit").write_text("ran"))

        def late():
            time.sleep(0.5)
            (out / "thread").write_text("joined")

        def main():
            threading.Thread(target=late).start()
            print("working")
            {body}

        run_rank(main)
        (out / "after").write_text("run_rank returned")
    """)
    return subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize(("body", "code", "stderr"), [
    ("", 0, ""),
    ("raise SystemExit(3)", 3, ""),
    ("raise SystemExit('bad --flag: use --x')", 1, "bad --flag: use --x"),
    ("raise ValueError('boom')", 1, "ValueError: boom"),
])
def test_the_status_is_mains_after_threads_and_atexit_handlers(tmp_path, body, code,
                                                                stderr) -> None:
    proc = _run(tmp_path, body)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout == "working\n"  # flushed before os._exit
    assert stderr in proc.stderr
    assert (tmp_path / "atexit").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "joined"
    assert not (tmp_path / "after").exists()
