"""The recovery load generator: claims every orphan over gRPC, `--limit` rows per call.

Run as its own process (the runner does this, after `bench.orphans` seeded
the server's database):

    python -m bench.claim_load --address 127.0.0.1:PORT --expect 100000 --limit 1000

One rescuing gateway registers (platform slack), then calls ClaimRecoverable
with `limit` back to back until a call claims nothing. The clock runs from
the first call to the end of the last one that claimed rows; every claimed
id must be new and their number must equal `--expect`. Each call's latency
is a sample. Prints one JSON object (a `bench.stats.Measurement` whose
"cycles" are claimed rows) on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

import grpc
from google.protobuf import duration_pb2

from bench.stats import summarise
from switchboard.delivery.v1 import delivery_service_pb2 as pb
from switchboard.delivery.v1 import delivery_service_pb2_grpc as pb_grpc

#: Per-call deadline: one claim of 1,000 rows over a 100k-row ledger takes well under it.
RPC_TIMEOUT_S = 60.0
#: Lease asked for at registration: longer than any measurement.
LEASE_TTL_S = 3600
#: The server's maximum rows per ClaimRecoverable call.
MAX_LIMIT = 1000


def _only_127(address: str) -> str:
    host = address.rsplit(":", 1)[0]
    if host not in ("127.0.0.1", "localhost"):
        raise SystemExit(f"refusing to load a server that is not on 127.0.0.1: {address}")
    return address


def run(address: str, expect: int, limit: int) -> dict[str, Any]:
    with grpc.insecure_channel(_only_127(address)) as channel:
        grpc.channel_ready_future(channel).result(timeout=10)
        stub = pb_grpc.DeliveryServiceStub(channel)
        registered = stub.RegisterInstance(
            pb.RegisterInstanceRequest(
                # The crashed gateway's next process: only its instances claim its rows.
                gateway_name="bench-crashed-gateway",
                host="bench",
                pid=os.getpid(),
                platforms=["slack"],
                lease_ttl=duration_pb2.Duration(seconds=LEASE_TTL_S),
            ),
            timeout=10,
        )
        instance_id = registered.instance.instance_id
        request = pb.ClaimRecoverableRequest(instance_id=instance_id, limit=limit)
        attempting = pb.OBLIGATION_STATE_ATTEMPTING
        claimed: set[str] = set()
        latencies: list[float] = []
        calls = abandoned = duplicates = 0
        wrong = ""
        cpu_before = resource.getrusage(resource.RUSAGE_SELF)
        started = last_rows_at = time.perf_counter()
        while True:
            began = time.perf_counter()
            response = stub.ClaimRecoverable(request, timeout=RPC_TIMEOUT_S)
            ended = time.perf_counter()
            calls += 1
            abandoned += response.abandoned_count
            if not response.obligations:
                break
            latencies.append(ended - began)
            last_rows_at = ended
            for row in response.obligations:
                if row.id in claimed:
                    duplicates += 1
                claimed.add(row.id)
                mine = (row.owner_instance_id, row.state) == (instance_id, attempting)
                if not mine and not wrong:
                    wrong = f"row {row.id} came back {row.state} owned by {row.owner_instance_id}"
        cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    elapsed = last_rows_at - started
    cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
    problems = [
        text
        for text in (
            f"{len(claimed):,} rows claimed, {expect:,} expected" if len(claimed) != expect else "",
            f"{duplicates} row(s) claimed twice" if duplicates else "",
            f"{abandoned} row(s) abandoned" if abandoned else "",
            wrong,
        )
        if text
    ]
    measurement = summarise(
        "claim", 1, elapsed, latencies, len(claimed), errors=len(problems), channels=1
    )
    # One RPC per `limit` rows: rpcs_per_s is then the rate of calls that claimed rows.
    measurement.rpcs_per_cycle = len(latencies) / len(claimed) if claimed else 0.0
    measurement.extra = {
        "rows": len(claimed),
        "calls": calls,
        "limit": limit,
        "claim_s": round(elapsed, 3),
        "loadgen_cpu_s": round(cpu, 3),
        "loadgen_wall_s": round(elapsed, 3),
        "loadgen_cpu_util": round(cpu / elapsed, 3) if elapsed > 0 else 0.0,
        "first_error": "; ".join(problems),
    }
    return measurement.to_json()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", required=True, help="127.0.0.1:PORT of a DeliveryService")
    parser.add_argument("--expect", type=int, required=True, help="orphans seeded")
    parser.add_argument("--limit", type=int, default=MAX_LIMIT, help="rows per call")
    args = parser.parse_args(argv)
    if args.expect < 1 or not 1 <= args.limit <= MAX_LIMIT:
        parser.error(f"expect must be >= 1, limit 1..{MAX_LIMIT}")
    json.dump(run(args.address, args.expect, args.limit), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
