"""README.md's code blocks run, as written, against real services.

The walk-through runs every block in document order in one temporary directory,
with the services this test starts: ```python and ```sh blocks run in
subprocesses, ```text blocks are diagrams and sample output. The environment
the blocks run in gives them the test's addresses through the variables the
`switchboard` command reads (`SWITCHBOARD_SESSION_ADDRESS`,
`SWITCHBOARD_DELIVERY_ADDRESS`), and sends what `switchboard serve` would put
under ./var to a temporary directory, on ports of its own
(`SWITCHBOARD_DATA_DIR`, `SWITCHBOARD_*_LISTEN`). The directives (HTML comments
right above a fence, see `tests/docs/blocks.py`) this file knows:

- `no-run REASON`: not run (a reason is required), e.g. Kubernetes or PyPI installs.
- `background TEXT`: a server; started, ready when a line contains TEXT, its
  printed addresses health-checked, then stopped with SIGTERM (exit 0 expected).
- `in-checkout`: runs in the checkout (`python3 dev.py ...`) instead of the temp dir.
- `file NAME`: a Python block saved as NAME for the blocks after it, which must run it.
- `output`: a ```text block of sample output; each of its lines must appear, in
  order, in what the block run before it printed (ports and directories aside).

The Python client example is run again on SQLite and Postgres for what it
promises: two runs for one inbound message post once, a reply held by a live
instance is left to it, and the reply of a holder SIGKILLed mid-send is redelivered
with the marker.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from switchboard_client import DeliveryClient
from switchboard_client.gateway import RECOVERED_MARKER

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from tests.docs.blocks import Block, read_blocks
from tests.harness import EventLoopThread, InProcessDelivery, delivery_server, session_server

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
BLOCKS = read_blocks(README)
RUNNABLE = {"python", "sh", "bash"}
DIRECTIVES = {"no-run", "background", "in-checkout", "file", "output"}
#: What FakeSlack prints for each post: the test counts the platform's sends by it.
POSTED = "slack <- "
#: A block must finish well within this; it only guards against a hang.
BLOCK_TIMEOUT_S = 120.0

_LISTENING = re.compile(r"(\w+Service) listening on (\S+)")


# -- the blocks themselves ------------------------------------------------------------------


def test_every_block_is_labelled_and_its_directives_are_known() -> None:
    assert BLOCKS, "no code blocks found in README.md"
    for block in BLOCKS:
        assert block.language in RUNNABLE | {"text"}, (
            f"{block.where}: label the block ```python, ```sh or ```text (diagrams and output)"
        )
        unknown = set(block.directives) - DIRECTIVES
        assert not unknown, f"{block.where}: unknown directive(s) {sorted(unknown)}"
        if block.directive("no-run") is not None:
            assert block.directive("no-run"), f"{block.where}: no-run needs a reason"
            assert block.language in RUNNABLE, f"{block.where}: only runnable blocks skip runs"
        if block.directive("output") is not None:
            assert block.language == "text", f"{block.where}: sample output is ```text"
        if block.directive("file") is not None:
            assert block.language == "python" and block.directive("file"), block.where
        if block.directive("background") is not None:
            assert block.language in {"sh", "bash"} and block.directive("background")


def test_the_block_reader_reads_fences_and_directives(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "text\n\n<!-- docs: no-run needs a cluster -->\n<!-- docs: in-checkout -->\n"
        "```sh extra words\nkubectl apply\n```\n\n  ~~~python\n  print(1)\n\n  ~~~\n```\n```\n"
    )
    first, second, third = read_blocks(page)
    assert (first.line, first.language, first.code) == (5, "sh", "kubectl apply\n")
    assert first.directives == {"no-run": "needs a cluster", "in-checkout": ""}
    assert (second.language, second.code, second.directives) == ("python", "print(1)\n\n", {})
    assert (third.language, third.code) == ("", "")
    page.write_text("```sh\nnever closed\n")
    with pytest.raises(ValueError, match="unclosed"):
        read_blocks(page)


def test_the_python_blocks_pass_the_repositorys_lint_and_strict_types(tmp_path: Path) -> None:
    """What users copy is held to the code's own standard (ruff, mypy --strict).

    Import order is left out: in this checkout `switchboard` is first-party, in a
    user's project it is not, so the two would sort the imports differently."""
    scripts = []
    for block in (b for b in BLOCKS if b.language == "python"):
        script = tmp_path / f"block_{block.line}.py"
        script.write_text(block.code)
        scripts.append(str(script))
    assert scripts, "README.md has no python block"
    bin_dir = Path(sys.executable).parent
    config = str(ROOT / "pyproject.toml")
    for command in (
        [str(bin_dir / "ruff"), "check", "--config", config, "--extend-ignore", "I", *scripts],
        [str(bin_dir / "ruff"), "format", "--config", config, "--check", *scripts],
        [str(bin_dir / "mypy"), "--cache-dir", str(tmp_path / "mypy-cache"), *scripts],
    ):
        done = run(command, ROOT, dict(os.environ))
        assert done.returncode == 0, f"{' '.join(command)}:\n{done.output}"


# -- running them ---------------------------------------------------------------------------


@dataclass
class Run:
    returncode: int
    output: str  # stdout and stderr, interleaved as printed

    def posts(self) -> list[str]:
        return [line for line in self.output.splitlines() if line.startswith(POSTED)]


def block_env(directory: Path, delivery: str, session: str) -> dict[str, str]:
    """The caller's environment, minus any Switchboard settings it had, plus the test's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWITCHBOARD_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        SWITCHBOARD_DELIVERY_ADDRESS=delivery,
        SWITCHBOARD_SESSION_ADDRESS=session,
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
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=BLOCK_TIMEOUT_S,
        check=False,
    )
    return Run(done.returncode, done.stdout)


def run_background(block: Block, cwd: Path, env: dict[str, str]) -> Run:
    """Starts the server, waits for its ready line, checks it answers, stops it."""
    ready = block.directive("background") or ""
    process = subprocess.Popen(
        ["bash", "-c", block.code],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so SIGTERM reaches the server
    )
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_pump, args=(process, lines), daemon=True).start()
    printed: list[str] = []
    try:
        _read_until(lines, printed, ready, block)
        for service, address in _LISTENING.findall("".join(printed)):
            assert _serving(address), f"{block.where}: {service} at {address} is not SERVING"
        os.killpg(process.pid, signal.SIGTERM)
        returncode = process.wait(timeout=BLOCK_TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    while (line := lines.get(timeout=BLOCK_TIMEOUT_S)) is not None:
        printed.append(line)
    return Run(returncode, "".join(printed))


def _pump(process: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.put(line)
    lines.put(None)


def _read_until(
    lines: queue.Queue[str | None], printed: list[str], ready: str, block: Block
) -> None:
    deadline = time.monotonic() + BLOCK_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            break
        if line is None:
            break
        printed.append(line)
        if ready in line:
            return
    raise AssertionError(f"{block.where}: no line with {ready!r}; it printed:\n{''.join(printed)}")


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


@dataclass
class Walk:
    """Runs blocks in order in one directory, remembering what ran."""

    directory: Path
    env: dict[str, str]
    ran: set[int] = field(default_factory=set)
    runs: dict[int, Run] = field(default_factory=dict)
    saved: dict[str, Block] = field(default_factory=dict)
    last: Run | None = None

    def step(self, block: Block) -> None:
        if block.language == "text":
            if block.directive("output") is not None:
                assert self.last is not None, f"{block.where}: no block ran before the output"
                assert_sample_output(block, self.last.output)
            return
        if block.directive("no-run") is not None:
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
        self.runs[block.line] = outcome
        self.last = outcome
        for name, saved in self.saved.items():
            if name in block.code:
                self.ran.add(saved.line)

    def _execute(self, block: Block) -> Run:
        cwd = ROOT if block.directive("in-checkout") is not None else self.directory
        if block.directive("background") is not None:
            return run_background(block, cwd, self.env)
        if block.language == "python":
            script = self.directory / f"block_{block.line}.py"
            script.write_text(block.code)
            return run([sys.executable, str(script)], cwd, self.env)
        return run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd, self.env)


def test_every_readme_block_runs_against_real_services(
    tmp_path: Path, loop_thread: EventLoopThread
) -> None:
    with (
        delivery_server(loop_thread, f"sqlite:///{tmp_path / 'delivery.sqlite3'}") as delivery,
        session_server(loop_thread, f"sqlite:///{tmp_path / 'session.sqlite3'}") as session,
    ):
        work = tmp_path / "work"
        work.mkdir()
        walk = Walk(work, block_env(work, delivery.address, session.address))
        checkout_data = _mtime(ROOT / "var")
        for block in BLOCKS:
            walk.step(block)
        rows = list(DeliveryClient(delivery.address).list())

    runnable = {
        block.line
        for block in BLOCKS
        if block.language in RUNNABLE and block.directive("no-run") is None
    }
    assert walk.ran == runnable, f"blocks that never ran: {sorted(runnable - walk.ran)}"
    # The example was run twice for one inbound message: one post, one delivered row.
    posts = [line for outcome in walk.runs.values() for line in outcome.posts()]
    assert len(posts) == 1, posts
    assert [row.state for row in rows] == [dpb.OBLIGATION_STATE_DELIVERED]
    assert _mtime(ROOT / "var") == checkout_data, "a block wrote into the checkout's var/"


def _mtime(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None


# -- the Python client example's promises ---------------------------------------------------


def example() -> Block:
    (block,) = [b for b in BLOCKS if b.directive("file") == "reply.py"]
    return block


@dataclass
class Example:
    """The example saved as a script, run as often as wanted against one ledger."""

    directory: Path
    delivery: InProcessDelivery

    def run(self) -> Run:
        script = self.directory / "reply.py"
        script.write_text(example().code)
        env = block_env(self.directory, self.delivery.address, "127.0.0.1:1")
        outcome = run([sys.executable, str(script)], self.directory, env)
        assert outcome.returncode == 0 and "Traceback" not in outcome.output, outcome.output
        return outcome


@pytest.fixture
def reply_example(
    database_url: str, loop_thread: EventLoopThread, tmp_path: Path
) -> Iterator[Example]:
    with delivery_server(loop_thread, database_url) as delivery:
        yield Example(tmp_path, delivery)


@pytest.fixture(scope="module")
def example_row(
    loop_thread: EventLoopThread, tmp_path_factory: pytest.TempPathFactory
) -> dpb.Obligation:
    """The row the example records, as a first run on a ledger of its own leaves it."""
    directory = tmp_path_factory.mktemp("example")
    with delivery_server(loop_thread, f"sqlite:///{directory / 'ledger.sqlite3'}") as delivery:
        Example(directory, delivery).run()
        (row,) = DeliveryClient(delivery.address).list()
    return row


def record_like(ledger: DeliveryClient, instance_id: str, row: dpb.Obligation) -> dpb.Obligation:
    """Records the reply the example records, as another instance of its gateway would."""
    return ledger.record(
        instance_id,
        session_key=row.session_key,
        content=row.content,
        platform=row.platform,
        chat_id=row.chat_id,
        message_ref=row.message_ref,
        begin_attempt=True,
    ).obligation


def test_the_example_run_twice_for_one_inbound_message_posts_once(
    reply_example: Example,
) -> None:
    first, second = reply_example.run(), reply_example.run()

    assert len(first.posts()) == 1, first.output
    assert second.posts() == [], second.output
    assert "delivered already" in second.output
    with DeliveryClient(reply_example.delivery.address) as ledger:
        (row,) = ledger.list()
        assert row.state == dpb.OBLIGATION_STATE_DELIVERED
        assert not ledger.instance(row.owner_instance_id).live  # it deregistered on stop


def test_the_example_leaves_a_reply_a_live_instance_is_sending_to_it(
    reply_example: Example, example_row: dpb.Obligation
) -> None:
    with DeliveryClient(reply_example.delivery.address) as ledger:
        other = ledger.register(example_row.gateway_name, ["slack"]).instance_id
        held = record_like(ledger, other, example_row)
        assert held.state == dpb.OBLIGATION_STATE_ATTEMPTING

        outcome = reply_example.run()

        assert outcome.posts() == [], outcome.output
        assert f"live instance {other}" in outcome.output
        assert ledger.get(held.id) == held  # untouched: same state, holder and fence


#: A gateway process that records the example's reply (straight into ATTEMPTING) on a
#: one-second lease, says so, and waits to be SIGKILLed before it sends.
_CRASHING_HOLDER = """
import json, sys, time
from switchboard_client import DeliveryClient
address, gateway, row = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
ledger = DeliveryClient(address)
me = ledger.register(gateway, ["slack"], lease_ttl_s=1.0).instance_id
held = ledger.record(me, begin_attempt=True, **row).obligation
print(me, held.id, flush=True)
time.sleep(600)
"""


def crashed_holder(address: str, row: dpb.Obligation) -> tuple[str, str]:
    """Runs `_CRASHING_HOLDER`, SIGKILLs it once it holds the row, and waits until the
    ledger judges it dead (its lease lapsed). Returns its instance id and the row's id."""
    fields = {
        name: getattr(row, name)
        for name in ("session_key", "content", "platform", "chat_id", "message_ref")
    }
    holder = subprocess.Popen(
        [sys.executable, "-c", _CRASHING_HOLDER, address, row.gateway_name, json.dumps(fields)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        instance_id, row_id = holder.stdout.readline().split()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=BLOCK_TIMEOUT_S)
    with DeliveryClient(address) as ledger:
        deadline = time.monotonic() + BLOCK_TIMEOUT_S  # a hang guard, not a timing assert
        while ledger.instance(instance_id).live:
            assert time.monotonic() < deadline, f"{instance_id} stayed live after SIGKILL"
            time.sleep(0.2)
    return instance_id, row_id


def test_the_example_redelivers_a_killed_holders_reply_with_the_marker(
    reply_example: Example, example_row: dpb.Obligation
) -> None:
    crashed, row_id = crashed_holder(reply_example.delivery.address, example_row)
    with DeliveryClient(reply_example.delivery.address) as ledger:
        assert ledger.get(row_id).state == dpb.OBLIGATION_STATE_ATTEMPTING

        outcome = reply_example.run()

        (post,) = outcome.posts()
        assert RECOVERED_MARKER.strip() in post and example_row.content in post
        row = ledger.get(row_id)
        assert row.state == dpb.OBLIGATION_STATE_DELIVERED
        assert row.owner_instance_id not in ("", crashed)
