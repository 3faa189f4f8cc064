"""bench.instructions reads instruction counts from real callgrind output files.

Both tests run valgrind itself on a small Python process (a few seconds each):
one against the count valgrind prints at exit, one through the same
`callgrind_control` steps the benchmark takes with a server (zero, instrument on,
off, dump).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.instructions import Callgrind, callgrind_instructions, callgrind_prefix

pytestmark = pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("callgrind_control") is None,
    reason="valgrind is not installed (Debian package valgrind)",
)


def test_the_count_read_from_a_file_is_the_one_valgrind_reports(tmp_path: Path) -> None:
    out = tmp_path / "callgrind.out"
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         "-c", "pass"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    collected = re.search(r"Collected : (\d+)", done.stderr)
    assert collected is not None, done.stderr
    assert callgrind_instructions(out) == int(collected.group(1)) > 1_000_000


def test_a_dump_of_an_instrumented_window_is_counted(tmp_path: Path) -> None:
    # A process that runs Python code for about a minute of real time, started as the
    # benchmark starts a server: nothing counted until instrumentation is switched on.
    busy = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: sum(range(100))"
    process = subprocess.Popen(
        [*callgrind_prefix(tmp_path), sys.executable, "-c", busy],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        callgrind = Callgrind(process.pid, tmp_path)
        deadline = time.monotonic() + 60
        while True:  # callgrind_control finds the process once valgrind is up
            try:
                callgrind.zero()
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        nothing = callgrind.dump()
        callgrind.instrument(True)
        time.sleep(1.0)
        callgrind.instrument(False)
        counted = callgrind.dump()
    finally:
        process.kill()
        process.wait(timeout=30)
    dumps = sorted(tmp_path.glob("callgrind.out.*"))
    assert len(dumps) == 2
    assert nothing == 0
    # A second of a busy loop: far more than the instructions around the switches.
    assert counted > 10_000_000
    # The window's count is in `totals:`; callgrind leaves the dump's `summary:` at 0.
    text = dumps[-1].read_text()
    assert f"totals: {counted}" in text
    assert "summary: 0" in text


def test_a_file_without_totals_or_summary_is_refused(tmp_path: Path) -> None:
    cut = tmp_path / "callgrind.out"
    cut.write_text("# callgrind format\nversion: 1\nevents: Ir\n")
    with pytest.raises(ValueError, match="neither"):
        callgrind_instructions(cut)
