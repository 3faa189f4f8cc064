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
from pathlib import Path

import pytest

from bench.instructions import Callgrind, callgrind_instructions, callgrind_prefix, gc_instructions

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
    # Started as the benchmark starts a server (nothing counted until instrumentation is
    # switched on), a process that does a fixed piece of work for every line it reads.
    work = (
        "import sys\n"
        "for line in sys.stdin:\n"
        "    sum(range(1_000_000))\n"
        "    print(line, end='', flush=True)\n"
    )
    process = subprocess.Popen(
        [*callgrind_prefix(tmp_path), sys.executable, "-c", work],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert process.stdin is not None and process.stdout is not None

    def one_piece_of_work() -> None:
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write("go\n")
        process.stdin.flush()
        assert process.stdout.readline() == "go\n"

    try:
        one_piece_of_work()  # valgrind is up and the interpreter has started
        callgrind = Callgrind(process.pid, tmp_path)
        callgrind.zero()
        one_piece_of_work()  # not counted: instrumentation is off
        nothing, _ = callgrind.dump()
        callgrind.instrument(True)
        one_piece_of_work()
        callgrind.instrument(False)
        counted, dump = callgrind.dump()
    finally:
        process.kill()
        process.wait(timeout=30)
    dumps = sorted(tmp_path.glob("callgrind.out.*"))
    assert len(dumps) == 2
    assert dump == dumps[-1]
    assert nothing == 0
    # Summing a million ints takes tens of millions of instructions.
    assert counted > 10_000_000
    # The window's count is in `totals:`; callgrind leaves the dump's `summary:` at 0.
    text = dump.read_text()
    assert f"totals: {counted}" in text
    assert "summary: 0" in text


def _callgrind_run(out: Path, code: str) -> None:
    subprocess.run(
        ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
         "-c", code],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip


def test_the_instructions_of_explicit_collections_are_counted_as_gc(tmp_path: Path) -> None:
    # Two programs alike but for five full collections over 20,000 live objects: what
    # the second costs more is nearly all inside the collector.
    setup = "import gc\nlive = [[] for _ in range(20_000)]\n"
    _callgrind_run(tmp_path / "without", setup)
    _callgrind_run(tmp_path / "with", setup + "for _ in range(5): gc.collect()\n")
    extra = callgrind_instructions(tmp_path / "with") - callgrind_instructions(tmp_path / "without")
    extra_gc = gc_instructions(tmp_path / "with") - gc_instructions(tmp_path / "without")
    assert extra > 1_000_000
    assert 0.8 * extra < extra_gc <= extra * 1.05


def test_a_file_without_totals_or_summary_is_refused(tmp_path: Path) -> None:
    cut = tmp_path / "callgrind.out"
    cut.write_text("# callgrind format\nversion: 1\nevents: Ir\n")
    with pytest.raises(ValueError, match="neither"):
        callgrind_instructions(cut)
