"""Log lines are written in batches (switchboard.observability.BatchingStreamHandler):
INFO lines reach stderr within the flush interval while the process keeps running,
WARNING and above at once with everything before them, and an orderly exit writes
everything it holds. Each case is a real child process whose stderr is a pipe."""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from switchboard import observability

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Child:
    process: subprocess.Popen[str]
    lines: queue.Queue[str]

    def line(self) -> str:
        """The next stderr line; fails if none arrives within PATIENCE_S."""
        try:
            return self.lines.get(timeout=PATIENCE_S)
        except queue.Empty:
            raise AssertionError(f"no line within {PATIENCE_S:g} s: lines were held back") from None


#: How long a line may take to show up before the test gives up: a liveness bound far
#: above the flush interval (the children below never exit on their own in that time).
PATIENCE_S = 30.0


@contextmanager
def child(script: str) -> Iterator[Child]:
    """A Python child that configures Switchboard's logging, then runs `script`;
    its stderr lines are read as they come."""
    code = (
        "import logging, sys, time\n"
        "from switchboard.observability import configure_logging\n"
        "configure_logging('INFO', json_format=False)\n"
        "log = logging.getLogger('switchboard.access')\n" + script
    )
    process = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stderr=subprocess.PIPE, text=True
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stderr is not None
        for line in process.stderr:
            lines.put(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        yield Child(process, lines)
    finally:
        process.kill()
        process.wait(timeout=10)


def test_info_lines_arrive_within_the_interval_while_the_process_runs() -> None:
    # The child logs, then sleeps without exiting: the lines can only arrive
    # through the periodic flush.
    with child("log.info('first call'); log.info('second call'); time.sleep(3600)\n") as running:
        assert "first call" in running.line()
        assert "second call" in running.line()


def test_a_warning_is_written_at_once_after_the_lines_before_it() -> None:
    # An interval of an hour: only the WARNING's own flush can write anything.
    script = (
        "from switchboard.observability import BatchingStreamHandler\n"
        "logging.getLogger().handlers[:] = [BatchingStreamHandler(interval=3600)]\n"
        "log.info('before'); log.warning('trouble'); time.sleep(3600)\n"
    )
    with child(script) as running:
        assert "before" in running.line()
        assert "trouble" in running.line()


def test_an_orderly_exit_writes_every_buffered_line() -> None:
    script = "for i in range(2000): log.info('call %d', i)\n"
    with child(script) as running:
        assert running.process.wait(timeout=PATIENCE_S) == 0
        lines = [running.line() for _ in range(2000)]
    assert [line.split()[-1] for line in lines] == [str(i) for i in range(2000)]


def test_the_handler_falls_back_to_stderr_without_a_descriptor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As under click's CliRunner: sys.stderr replaced by an object without fileno().
    import io

    class NoDescriptor(io.StringIO):
        def fileno(self) -> int:
            raise io.UnsupportedOperation("fileno")

    replaced = NoDescriptor()
    monkeypatch.setattr(sys, "stderr", replaced)
    handler = observability.BatchingStreamHandler()
    try:
        assert handler.stream is replaced
    finally:
        handler.close()
