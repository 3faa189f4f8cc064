"""Summaries of profiles of the server: py-spy collapsed stacks and cProfile stats."""

from __future__ import annotations

import io
import pstats
import re
from collections import Counter, defaultdict
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")

#: Where a sample was, decided by its innermost frame that matches a rule: (category,
#: substring of the frame's file, regular expression its function must match).
_RULES: tuple[tuple[str, str, str], ...] = (
    ("idle: epoll wait of the event loop", "selectors.py", r"select$"),
    ("db driver: execute (GIL released inside)", "peewee.py", r"(_execute_cursor|execute_sql)$"),
    ("db driver: begin/commit (fsync inside)", "peewee.py", r"(commit|begin|rollback)$"),
    ("peewee: compiling SQL", "peewee.py", r"(__sql__|__sql_selection__|^Context\.|^quote$)"),
    ("peewee: building queries, wrapping results", "peewee.py", r""),
    ("servicer: message conversion", "servicer.py", r""),
    ("servicer: message conversion", "proto_time.py", r""),
    ("ledger / store / records", "delivery_service/", r""),
    ("session core / log store / replay", "session_service/", r""),
    ("protobuf (Python side)", "google/protobuf/", r""),
    ("transaction runner (incl. waiting for work)", "switchboard/database.py", r""),
    ("error interceptor", "grpc_errors.py", r""),
    ("grpc (Cython core, C)", "cygrpc", r""),
    ("grpc (Python)", "grpc/", r""),
    ("asyncio callbacks (incl. grpc Cython code)", "asyncio/", r""),
    ("stdlib threading / queue", "threading.py", r""),
)
_PROJECT = ("switchboard/", "delivery_service/", "session_service/")


def _parse(frame: str) -> tuple[str, str]:
    match = _FRAME.match(frame)
    if not match:
        return frame, ""
    return match.group("function"), match.group("file")


def _short(frame: str) -> str:
    function, path = _parse(frame)
    for marker in ("site-packages/", "lib/python3.11/", "/work/main/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    return f"{function} ({path})" if path else function


def _category(frames: list[str]) -> str:
    for frame in reversed(frames):
        function, path = _parse(frame)
        for name, file_part, pattern in _RULES:
            if file_part in path and re.search(pattern, function):
                return name
    return "other (native, unresolved)"


def _thread_of(stack: list[str]) -> tuple[str, list[str]]:
    """py-spy's --threads puts a thread frame first (after a process frame, if any)."""
    frames = [f for f in stack if not f.startswith("process ")]
    if frames and frames[0].startswith("thread "):
        return frames[0], frames[1:]
    return "thread ?", frames


def summarise_py_spy(path: Path, top: int = 12) -> str:
    """Per thread: share of samples and where they were; then the heaviest project frames."""
    if not path.exists():
        return f"(no profile written at {path})"
    per_thread: Counter[str] = Counter()
    categories: defaultdict[str, Counter[str]] = defaultdict(Counter)
    project: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack_text, _, count_text = line.rpartition(" ")
        if not stack_text or not count_text.isdigit():
            continue
        count = int(count_text)
        thread, frames = _thread_of(stack_text.split(";"))
        total += count
        per_thread[thread] += count
        categories[thread][_category(frames)] += count
        for frame in dict.fromkeys(_short(f) for f in frames if any(p in f for p in _PROJECT)):
            project[frame] += count
    if total == 0:
        return f"(empty profile at {path})"
    out = io.StringIO()
    out.write(f"{total} samples (percentages are of all samples)\n")
    for thread, count in per_thread.most_common(4):
        out.write(f"  {100 * count / total:5.1f}%  {thread}\n")
        for name, n in categories[thread].most_common(8):
            if 100 * n / total >= 0.5:
                out.write(f"      {100 * n / total:5.1f}%  {name}\n")
    out.write("  heaviest project frames (inclusive):\n")
    for frame, count in project.most_common(top):
        out.write(f"    {100 * count / total:5.1f}%  {frame}\n")
    return out.getvalue().rstrip()


def summarise_cprofile(path: Path, top: int = 25) -> str:
    if not path.exists():
        return f"(no profile written at {path})"
    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.strip_dirs().sort_stats("cumulative").print_stats(top)
    stats.sort_stats("tottime").print_stats(top)
    return out.getvalue().rstrip()
