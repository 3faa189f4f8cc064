"""`python -m bench.preauth_memory [--against REV] [--token]`: what callers without a
valid token make a server hold.

The two attacks of issue 12, against a real `switchboard serve session` process with
tokens configured (SQLite in a temporary directory), from raw HTTP/2 connections
(the `h2` package) in this process:

- partial: 200 connections, each opening PostToInbox with a request that announces
  4 MiB, sending all of it but the last byte as fast as the server lets it in, then
  holding the connection open;
- parallel: 48 connections at once, each sending a whole 16.5 MB PostToInbox request.

Each attack gets a fresh server. Reported per attack: the server's peak RSS growth
(its peak during the attack, VmHWM after resetting it through /proc/PID/clear_refs
and VmRSS sampled every 20 ms, over its RSS just before), the request bytes the
server let in (flow control), and the statuses it answered.

`--against REV` runs the server code of REV (e.g. `main`) the same way, for a
before/after table. `--token` runs both attacks once more with a valid token, which
gRPC must read: that memory is bounded by `--max-concurrent-rpcs` times `--max-message-bytes`
(set the server's flags through their SWITCHBOARD_* variables in this environment).
Results: stdout, and bench/results/preauth_memory.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import h2.exceptions

from bench import servers
from bench.against import release_tree
from bench.harness import RESULTS_DIR, log

TOKEN = "bench-admin-token"
METHOD = b"/switchboard.session.v1.SessionService/PostToInbox"
MiB = 1024 * 1024
#: Seconds without any progress after which a sender stops (the server grants no window).
STALL_S = 2.0
ANSWER_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Attack:
    name: str
    connections: int
    #: Size of the request message (what its gRPC frame announces).
    message_bytes: int
    #: Whether the last byte is held back and the connection kept open.
    partial: bool


ATTACKS = (
    Attack("200 connections x partial 4 MiB", 200, 4 * MiB, partial=True),
    Attack("48 parallel x 16.5 MB", 48, 16_500_000, partial=False),
)


@dataclass
class Outcome:
    sent: int = 0
    status: str = "none"


@dataclass
class Result:
    tree: str
    attack: str
    token: bool
    baseline_rss_mb: float
    peak_rss_mb: float
    growth_mb: float
    accepted_mb: float
    answers: dict[str, int] = field(default_factory=dict)


def request_message(size: int) -> bytes:
    """A valid PostToInboxRequest of exactly `size` bytes (the server can parse it)."""
    from switchboard.session.v1 import session_service_pb2 as pb

    def build(content_bytes: int) -> bytes:
        message = pb.Message(role=pb.ROLE_USER, content="x" * content_bytes)
        request = pb.PostToInboxRequest(agent="main", session_id="s", message=message)
        return request.SerializeToString()

    content = size - len(build(0)) - 8  # room for the longer length varints
    while len(encoded := build(content)) < size:
        content += size - len(encoded)
    assert len(encoded) == size, (len(encoded), size)
    return encoded


# -- one connection -----------------------------------------------------------------------


async def _attack_connection(
    address: str, attack: Attack, frame: memoryview, token: bool, release: asyncio.Event
) -> Outcome:
    """Sends `frame` (all but its last byte if partial) on one stream; returns what the
    server let in and answered. A partial sender then holds until `release`."""
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    config = h2.config.H2Configuration(client_side=True, header_encoding=None)
    connection = h2.connection.H2Connection(config)
    connection.initiate_connection()
    stream = connection.get_next_available_stream_id()
    headers = [
        (b":method", b"POST"), (b":scheme", b"http"), (b":path", METHOD),
        (b":authority", b"switchboard"), (b"content-type", b"application/grpc"),
        (b"te", b"trailers"),
    ]  # fmt: skip
    if token:
        headers.append((b"authorization", b"Bearer " + TOKEN.encode()))
    connection.send_headers(stream, headers)
    writer.write(connection.data_to_send())
    outcome = Outcome()
    total = len(frame) - 1 if attack.partial else len(frame)

    def receive(data: bytes) -> None:
        for event in connection.receive_data(data):
            if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                for key, value in event.headers:
                    if key == b"grpc-status":
                        outcome.status = value.decode()
            elif isinstance(event, h2.events.StreamReset) and outcome.status == "none":
                outcome.status = f"reset {event.error_code}"
        writer.write(connection.data_to_send())

    try:
        while outcome.sent < total and outcome.status == "none":
            window = min(
                connection.local_flow_control_window(stream), connection.max_outbound_frame_size
            )
            if window > 0:
                end = min(outcome.sent + window, total)
                last = end == total and not attack.partial
                connection.send_data(stream, bytes(frame[outcome.sent : end]), end_stream=last)
                writer.write(connection.data_to_send())
                await writer.drain()
                outcome.sent = end
                continue
            try:
                data = await asyncio.wait_for(reader.read(65536), STALL_S)
            except TimeoutError:
                break  # the server lets no more in
            if not data:
                outcome.status = outcome.status if outcome.status != "none" else "closed"
                break
            receive(data)
        if attack.partial:
            await release.wait()
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while outcome.status == "none" and not attack.partial:
            data = await asyncio.wait_for(reader.read(65536), deadline - time.monotonic())
            if not data:
                outcome.status = "closed"
                break
            receive(data)
    except (ConnectionError, h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError):
        outcome.status = outcome.status if outcome.status != "none" else "connection lost"
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    return outcome


# -- the server's memory ----------------------------------------------------------------------


def _status_kb(pid: int, field_name: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field_name} for pid {pid}")


class PeakRss:
    """The server's peak RSS from now on: VmHWM (reset here) and VmRSS sampled."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        with contextlib.suppress(OSError):
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # resets VmHWM to VmRSS
        self.baseline_kb = _status_kb(pid, "VmRSS")
        self.sampled_kb = self.baseline_kb
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            with contextlib.suppress(OSError, RuntimeError):
                self.sampled_kb = max(self.sampled_kb, _status_kb(self.pid, "VmRSS"))

    def peak_kb(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.sampled_kb, _status_kb(self.pid, "VmHWM"))


# -- one attack on a fresh server --------------------------------------------------------------


async def _run(address: str, attack: Attack, frame: memoryview, token: bool) -> list[Outcome]:
    release = asyncio.Event()
    tasks = [
        asyncio.create_task(_attack_connection(address, attack, frame, token, release))
        for _ in range(attack.connections)
    ]
    if attack.partial:
        # Hold every connection until none makes progress, then a moment more.
        while not all(task.done() for task in tasks):
            before = sum(1 for task in tasks if task.done())
            await asyncio.sleep(STALL_S + 1)
            if sum(1 for task in tasks if task.done()) == before:
                break
        await asyncio.sleep(1.0)
        release.set()
    return list(await asyncio.gather(*tasks))


@contextlib.contextmanager
def _tokens_configured() -> Iterator[None]:
    """Server processes inherit the environment: tokens for them, restored after."""
    before = os.environ.get("SWITCHBOARD_AUTH_TOKENS")
    os.environ["SWITCHBOARD_AUTH_TOKENS"] = f"{TOKEN}=admin"
    try:
        yield
    finally:
        if before is None:
            del os.environ["SWITCHBOARD_AUTH_TOKENS"]
        else:
            os.environ["SWITCHBOARD_AUTH_TOKENS"] = before


def _frame(message_bytes: int) -> memoryview:
    message = request_message(message_bytes)
    return memoryview(struct.pack(">BI", 0, len(message)) + message)


def measure(tree: str, code_root: Path, attack: Attack, token: bool) -> Result:
    frame = _frame(attack.message_bytes)
    with (
        servers.temp_dir("bench-preauth-") as data_dir,
        _tokens_configured(),
        servers.running_server(
            f"sqlite:///{data_dir / 'session.sqlite3'}",
            data_dir,
            service="session",
            code_root=code_root,
        ) as server,
    ):
        warmup = Attack("warm-up", 4, 64 * 1024, attack.partial)
        small = request_message(warmup.message_bytes)
        asyncio.run(
            _run(
                server.address, warmup, memoryview(struct.pack(">BI", 0, len(small)) + small), token
            )
        )
        time.sleep(1.0)
        peak = PeakRss(server.pid)
        outcomes = asyncio.run(_run(server.address, attack, frame, token))
        peak_kb = peak.peak_kb()
    return Result(
        tree=tree,
        attack=attack.name,
        token=token,
        baseline_rss_mb=round(peak.baseline_kb / 1024, 1),
        peak_rss_mb=round(peak_kb / 1024, 1),
        growth_mb=round((peak_kb - peak.baseline_kb) / 1024, 1),
        accepted_mb=round(sum(o.sent for o in outcomes) / 1_000_000, 1),
        answers=dict(Counter(_named(o.status) for o in outcomes)),
    )


def _named(status: str) -> str:
    names = {"0": "OK", "3": "INVALID_ARGUMENT", "8": "RESOURCE_EXHAUSTED", "16": "UNAUTHENTICATED"}
    return names.get(status, status)


def render(results: list[Result]) -> str:
    lines = [
        "| server | attack | token | RSS before | peak | growth | request bytes let in | answers |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        answers = ", ".join(f"{count} {name}" for name, count in sorted(r.answers.items()))
        lines.append(
            f"| {r.tree} | {r.attack} | {'valid' if r.token else 'none'} | "
            f"{r.baseline_rss_mb} MB | {r.peak_rss_mb} MB | **+{r.growth_mb} MB** | "
            f"{r.accepted_mb} MB | {answers} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.preauth_memory", description=__doc__)
    parser.add_argument("--against", metavar="REV", help="also run REV's server (e.g. main)")
    parser.add_argument("--token", action="store_true", help="also attack with a valid token")
    parser.add_argument(
        "--partial-connections",
        type=int,
        default=ATTACKS[0].connections,
        help="connections of the partial attack (past --max-connections to see the cap)",
    )
    args = parser.parse_args(argv)
    partial = ATTACKS[0]
    attacks = (
        Attack(f"{args.partial_connections} connections x partial 4 MiB",
               args.partial_connections, partial.message_bytes, partial=True),
        *ATTACKS[1:],
    )  # fmt: skip
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        trees = [("this tree", servers.REPO_ROOT)]
        if args.against:
            trees.append((args.against, stack.enter_context(release_tree(args.against))))
        for tree, root in trees:
            for token in (False, True) if args.token else (False,):
                for attack in attacks:
                    log(f"{tree}: {attack.name}, token {'valid' if token else 'none'}")
                    results.append(measure(tree, root, attack, token))
                    log(f"  growth +{results[-1].growth_mb} MB, answers {results[-1].answers}")
    print(render(results))
    RESULTS_DIR.mkdir(exist_ok=True)
    out = RESULTS_DIR / "preauth_memory.json"
    out.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    log(f"results: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
