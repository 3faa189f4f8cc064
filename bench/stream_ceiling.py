"""What gRPC itself allows per message on this machine: unary calls against messages on
one bidirectional stream per client, with no service code at all.

Why: every Switchboard write is a unary RPC, and the server is CPU-bound on one core
at 8 clients, most of it inside gRPC and asyncio (see the profiles of `python -m
bench --profile`). The no-op ceiling (Health/Check) bounds what any unary design can
reach; this measures how much higher the same bytes go when each client keeps one
stream open and sends its messages on it, each answered before the next is sent
(the shape a per-gateway stream of appends and ledger transitions would have). It
is the figure behind "what it would take" for the goals that the unary ceiling
rules out.

A server process (grpc.aio, generic handlers on raw bytes, echoing a 100-byte
payload) and a load-generator process (grpc.aio, N clients over one channel,
closed loop) run on 127.0.0.1; messages/s are counted over a window after a
warm-up, like the other benches.

    python -m bench.stream_ceiling [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

SERVICE = "bench.Echo"
PAYLOAD = b"x" * 100
CLIENTS = (1, 8)
REPO_ROOT = Path(__file__).resolve().parent.parent


def _identity(data: bytes) -> bytes:
    return data


async def _unary(request: bytes, _context: Any) -> bytes:
    return request


async def _stream(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
    async for request in requests:
        yield request


async def serve() -> None:
    server = grpc.aio.server()
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(
            _unary, request_deserializer=_identity, response_serializer=_identity
        ),
        "Stream": grpc.stream_stream_rpc_method_handler(
            _stream, request_deserializer=_identity, response_serializer=_identity
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


async def load(address: str, shape: str, clients: int, seconds: float, warmup_s: float) -> float:
    """Messages answered per second inside the window, over all clients."""
    counted = 0
    async with grpc.aio.insecure_channel(address) as channel:
        unary = channel.unary_unary(
            f"/{SERVICE}/Unary", request_serializer=_identity, response_deserializer=_identity
        )
        stream = channel.stream_stream(
            f"/{SERVICE}/Stream", request_serializer=_identity, response_deserializer=_identity
        )
        start = time.perf_counter()
        measure_from, stop_at = start + warmup_s, start + warmup_s + seconds

        async def client() -> None:
            nonlocal counted
            call = stream() if shape == "stream" else None
            while (now := time.perf_counter()) < stop_at:
                if call is None:
                    await unary(PAYLOAD)
                else:
                    await call.write(PAYLOAD)
                    await call.read()
                if now >= measure_from:
                    counted += 1
            if call is not None:
                await call.done_writing()

        await asyncio.gather(*(client() for _ in range(clients)))
    return counted / seconds


def measure(seconds: float, warmup_s: float) -> list[dict[str, Any]]:
    server = subprocess.Popen(
        [sys.executable, "-m", "bench.stream_ceiling", "--serve"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        address = f"127.0.0.1:{server.stdout.readline().strip()}"
        rows = []
        for clients in CLIENTS:
            for shape in ("unary", "stream"):
                out = subprocess.run(
                    [sys.executable, "-m", "bench.stream_ceiling", "--load", address, shape,
                     str(clients), str(seconds), str(warmup_s)],
                    cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                    timeout=seconds + warmup_s + 60,
                ).stdout  # fmt: skip
                rows.append({"shape": shape, "clients": clients, "per_s": json.loads(out)})
        return rows
    finally:
        server.kill()
        server.wait(timeout=10)


def render(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'shape':<8}{'clients':>8}{'messages/s':>12}  vs unary"]
    unary = {r["clients"]: r["per_s"] for r in rows if r["shape"] == "unary"}
    for row in rows:
        base = unary.get(row["clients"], 0.0)
        ratio = f"{row['per_s'] / base:.2f} x" if base else "n/a"
        lines.append(f"{row['shape']:<8}{row['clients']:>8}{row['per_s']:>12,.0f}  {ratio}")
    lines.append(
        "(grpc.aio echo of 100 bytes, no service code; stream: one bidirectional stream per "
        "client, each message answered before the next; one channel)"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_ceiling")
    parser.add_argument("--quick", action="store_true", help="3 s per measurement")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--load", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        asyncio.run(serve())
        return 0
    if args.load:
        address, shape, clients, seconds, warmup_s = args.load
        rate = asyncio.run(load(address, shape, int(clients), float(seconds), float(warmup_s)))
        print(json.dumps(rate))
        return 0
    seconds, warmup_s = (3.0, 1.0) if args.quick else (10.0, 2.0)
    print(render(measure(seconds, warmup_s)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
