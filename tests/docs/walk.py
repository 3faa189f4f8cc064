"""Runs a Markdown page's code blocks as a reader would, against real services.

A walk runs a page's blocks in document order in one directory: ```python,
```sh (```bash) and ```js blocks run in subprocesses; ```text blocks are diagrams,
listings and sample output. The environment gives the blocks the addresses of
the services they are to use through the variables the `switchboard` command and
the examples read (`SWITCHBOARD_SESSION_ADDRESS`, `SWITCHBOARD_DELIVERY_ADDRESS`),
and sends what `switchboard serve` would put under ./var to the walk's directory,
on ports of its own (`SWITCHBOARD_DATA_DIR`, `SWITCHBOARD_*_LISTEN`).

The directives (HTML comments right above a fence, see `tests/docs/blocks.py`):

- `no-run REASON`: not run (a reason is required), e.g. Kubernetes or PyPI installs.
- `background TEXT`: a server; started, ready when a line contains TEXT, its
  printed addresses health-checked, then stopped with SIGTERM (exit 0 expected).
- `serves TEXT`: the same, but it keeps running: the blocks after it (to the end
  of the page, or to the next `serves` block) call the addresses it printed. It is
  stopped with SIGTERM (exit 0 expected) when the page is done.
- `in-checkout`: runs in the checkout (`python3 dev.py ...`) instead of the walk's
  directory.
- `file NAME`: a Python block saved as NAME for the blocks after it, one of which
  must run it.
- `output`: a ```text block of sample output; each of its lines must appear, in
  order, in what the block run before it printed (ports and directories aside).
  Sample output is a first run's: it is checked on the first pass only.

Every runnable block must run twice: `walk_twice` walks the page, then walks it
again in the same directory against the same services, as a reader who comes
back to it would.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.docs.blocks import Block, read_blocks

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PYTHON_CLIENT_README = ROOT / "clients" / "python" / "README.md"
NODE_CLIENT = ROOT / "clients" / "node"
NODE_CLIENT_README = NODE_CLIENT / "README.md"

#: Every page whose blocks run: the README, the site's pages, the client READMEs.
PAGES: list[Path] = [
    README,
    *sorted(DOCS.rglob("*.md")),
    PYTHON_CLIENT_README,
    NODE_CLIENT_README,
]

RUNNABLE = {"python", "sh", "bash", "js"}
SHOWN = {"text"}
DIRECTIVES = {"no-run", "background", "serves", "in-checkout", "file", "output"}
NODE, NPM = shutil.which("node"), shutil.which("npm")
#: A block must finish well within this; it only guards against a hang.
BLOCK_TIMEOUT_S = 120.0

_LISTENING = re.compile(r"(\w+Service) listening on (\S+)")
_ADDRESS_VARIABLES = {
    "SessionService": "SWITCHBOARD_SESSION_ADDRESS",
    "DeliveryService": "SWITCHBOARD_DELIVERY_ADDRESS",
}


def relative(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def blocks_of(page: Path) -> list[Block]:
    return read_blocks(page)


def runs(block: Block) -> bool:
    """Whether a walk runs the block (or, for `file`, saves it for a later one)."""
    return block.language in RUNNABLE and block.directive("no-run") is None


def problems(block: Block) -> list[str]:
    """What is wrong with a block's label and directives, for people."""
    found = []
    if block.language not in RUNNABLE | SHOWN:
        found.append("label the block ```python, ```sh, ```js or ```text (diagrams, output)")
    unknown = set(block.directives) - DIRECTIVES
    if unknown:
        found.append(f"unknown directive(s) {sorted(unknown)}")
    if block.directive("no-run") is not None:
        if not block.directive("no-run"):
            found.append("no-run needs a reason")
        if block.language not in RUNNABLE:
            found.append("only runnable blocks skip runs")
    if block.directive("output") is not None and block.language != "text":
        found.append("sample output is ```text")
    if block.directive("file") is not None and not (
        block.language == "python" and block.directive("file")
    ):
        found.append("file NAME is for ```python blocks")
    for server in ("background", "serves"):
        if block.directive(server) is not None and not (
            block.language in {"sh", "bash"} and block.directive(server)
        ):
            found.append(f"{server} TEXT is for ```sh blocks, TEXT the ready line")
    if block.language == "js" and runs(block) and NODE is None:
        found.append("a js block runs with node, which is not on PATH")
    return [f"{block.where}: {problem}" for problem in found]


# -- running one block ------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    output: str  # stdout and stderr, interleaved as printed


def block_env(
    directory: Path, session: str, delivery: str, python: Path = Path(sys.executable)
) -> dict[str, str]:
    """The caller's environment, minus any Switchboard settings it had, plus the walk's.

    PATH starts with `python`'s directory (by default this interpreter's): what
    `source .venv/bin/activate` gives a reader."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env.update(
        PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
        SWITCHBOARD_SESSION_ADDRESS=session,
        SWITCHBOARD_DELIVERY_ADDRESS=delivery,
        SWITCHBOARD_DATA_DIR=str(directory / "var"),
        SWITCHBOARD_SESSION_LISTEN="127.0.0.1:0",
        SWITCHBOARD_DELIVERY_LISTEN="127.0.0.1:0",
        PYTHONUNBUFFERED="1",  # output in the order it was printed
    )
    return env


def run(command: list[str], cwd: Path, env: dict[str, str]) -> Run:
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    return Run(done.returncode, done.stdout)


@dataclass
class Server:
    """A `background` or `serves` block's process, ready and health-checked."""

    block: Block
    process: subprocess.Popen[str]
    lines: queue.Queue[str | None]
    printed: list[str]

    @property
    def addresses(self) -> dict[str, str]:
        return dict(_LISTENING.findall("".join(self.printed)))

    def stop(self) -> Run:
        """SIGTERM to its process group; what it printed and how it ended."""
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            returncode = self.process.wait(timeout=BLOCK_TIMEOUT_S)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        while (line := self.lines.get(timeout=BLOCK_TIMEOUT_S)) is not None:
            self.printed.append(line)
        return Run(returncode, "".join(self.printed))


def start_server(block: Block, cwd: Path, env: dict[str, str]) -> Server:
    """Starts the block, waits for its ready line, checks that what it serves answers."""
    ready = block.directive("serves") or block.directive("background") or ""
    process = subprocess.Popen(
        ["bash", "-c", block.code],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so SIGTERM reaches the server
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(process, lines), daemon=True).start()
    server = Server(block, process, lines, [])
    try:
        _read_until(server, ready)
        for service, address in server.addresses.items():
            assert _serving(address), f"{block.where}: {service} at {address} is not SERVING"
    except BaseException:
        server.stop()
        raise
    return server


def _pump(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)


def _read_until(server: Server, ready: str) -> None:
    deadline = time.monotonic() + BLOCK_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = server.lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            server.lines.put(None)  # for stop(), which reads to the end
            break
        server.printed.append(line)
        if ready in line:
            return
    raise AssertionError(
        f"{server.block.where}: no line with {ready!r}; it printed:\n{''.join(server.printed)}"
    )


def _serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )
    return bool(answer.status == health_pb2.HealthCheckResponse.SERVING)


def output_pattern(line: str) -> re.Pattern[str]:
    """A sample output line as a pattern: any port, any directory."""
    parts = re.split(r"(:\d+|/(?:[\w.-]+/)+)", line.strip())
    wildcards = {":": r":\d+", "/": r"/.*/"}  # the split's odd parts are ports and directories
    return re.compile(
        "".join(
            wildcards[part[0]] if index % 2 else re.escape(part) for index, part in enumerate(parts)
        )
    )


def assert_sample_output(block: Block, printed: str) -> None:
    actual = iter(printed.splitlines())
    for line in block.code.splitlines():
        if not line.strip():
            continue
        pattern = output_pattern(line)
        assert any(pattern.search(real) for real in actual), (
            f"{block.where}: {line!r} is not in (or not in this order in) the output:\n{printed}"
        )


# -- walking a page ---------------------------------------------------------------------------


@dataclass
class Walk:
    """Runs a page's blocks in order in one directory, remembering what ran and printed.
    `checkout` is where `in-checkout` blocks run, `python` what runs ```python blocks."""

    page: Path
    directory: Path
    env: dict[str, str]
    first_pass: bool = True
    checkout: Path = ROOT
    python: Path = Path(sys.executable)
    ran: set[int] = field(default_factory=set)
    outputs: list[tuple[Block, Run]] = field(default_factory=list)
    saved: dict[str, Block] = field(default_factory=dict)
    server: Server | None = None
    last: Run | None = None

    def walk(self) -> None:
        try:
            for block in blocks_of(self.page):
                self.step(block)
        except BaseException:
            if self.server is not None:
                self.server.stop()  # the failure above is the one to report
            raise
        self.stop_server()

    def step(self, block: Block) -> None:
        if block.language in SHOWN:
            if block.directive("output") is not None and self.first_pass:
                assert self.last is not None, f"{block.where}: no block ran before the output"
                assert_sample_output(block, self.last.output)
            return
        if not runs(block):
            return
        if block.directive("file") is not None:
            name = block.directive("file") or ""
            (self.directory / name).write_text(block.code)
            self.saved[name] = block
            return
        outcome = self._execute(block)
        assert outcome.returncode == 0, (
            f"{block.where} exited {outcome.returncode}:\n{block.code}\n--- it printed:\n"
            f"{outcome.output}"
        )
        assert "Traceback" not in outcome.output, f"{block.where}:\n{outcome.output}"
        self.ran.add(block.line)
        self.outputs.append((block, outcome))
        self.last = outcome
        for name, saved in self.saved.items():
            if name in block.code:
                self.ran.add(saved.line)

    def stop_server(self) -> None:
        if self.server is None:
            return
        server, self.server = self.server, None
        stopped = server.stop()
        assert stopped.returncode == 0, (
            f"{server.block.where} exited {stopped.returncode} on SIGTERM:\n{stopped.output}"
        )

    def _execute(self, block: Block) -> Run:
        cwd = self.checkout if block.directive("in-checkout") is not None else self.directory
        if block.directive("serves") is not None:
            self.stop_server()
            self.server = start_server(block, cwd, self.env)
            for service, address in self.server.addresses.items():
                self.env[_ADDRESS_VARIABLES[service]] = address
            return Run(0, "".join(self.server.printed))
        if block.directive("background") is not None:
            return start_server(block, cwd, self.env).stop()
        if block.language == "python":
            script = self.directory / f"block_{block.line}.py"
            script.write_text(block.code)
            return run([str(self.python), str(script)], cwd, self.env)
        if block.language == "js":
            return run_js(block, cwd, self.env)
        return run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd, self.env)


def run_js(block: Block, cwd: Path, env: dict[str, str]) -> Run:
    """A ```js block as an ES module inside the Node package, so that
    `@switchboard/client` resolves to it by name, as in an installed project."""
    assert NODE is not None, f"{block.where}: node is not on PATH"
    script = NODE_CLIENT / f".docs-block-{os.getpid()}-{block.line}.mjs"
    script.write_text(block.code)
    try:
        return run([NODE, str(script)], cwd, env)
    finally:
        script.unlink()


@dataclass
class Walked:
    """Both passes over a page: what ran and what each block printed."""

    ran: set[int]
    first: list[tuple[Block, Run]]
    second: list[tuple[Block, Run]]

    def printed(self) -> Iterator[str]:
        for _, outcome in [*self.first, *self.second]:
            yield outcome.output


def walk_twice(
    page: Path,
    directory: Path,
    session: str,
    delivery: str,
    *,
    checkout: Path = ROOT,
    python: Path = Path(sys.executable),
) -> Walked:
    """Walks the page, then again in the same directory: every block runs twice.
    `checkout` and `python` walk it in another clone, with that clone's .venv."""
    passes = []
    for first_pass in (True, False):
        env = block_env(directory, session, delivery, python)
        walk = Walk(page, directory, env, first_pass, checkout=checkout, python=python)
        walk.walk()
        passes.append(walk)
    first, second = passes
    runnable = {block.line for block in blocks_of(page) if runs(block)}
    assert first.ran == runnable, f"blocks that never ran: {sorted(runnable - first.ran)}"
    return Walked(first.ran, first.outputs, second.outputs)


def ensure_node_modules() -> None:
    """What clients/node/package-lock.json pins, installed once (as tests/test_node_client.py
    does), so that ```js blocks import `@switchboard/client` and its dependencies."""
    lock = json.loads((NODE_CLIENT / "package-lock.json").read_text())
    wanted = {
        path: entry["version"]
        for path, entry in lock["packages"].items()
        if path and "version" in entry
    }
    installed = NODE_CLIENT / "node_modules" / ".package-lock.json"
    with suppress(FileNotFoundError, KeyError, ValueError):
        have = json.loads(installed.read_text())["packages"]
        if all(have.get(path, {}).get("version") == version for path, version in wanted.items()):
            return
    assert NPM is not None, "npm is not on PATH"
    done = subprocess.run(
        [NPM, "ci", "--no-audit", "--no-fund", "--prefer-offline"],
        cwd=NODE_CLIENT, capture_output=True, text=True, timeout=180, check=False,
        env={**os.environ, "npm_config_update_notifier": "false"},
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
