"""Writes the upgrade fixture: SQLite files made by an old release, and what it read.

Run it with the OLD release's code first on the path, e.g. for the release
before schema migrations (commit 360f72e):

    git archive 360f72e | tar -x -C /tmp/old
    cp switchboard/*/v1/*_pb2*.py* into the same places under /tmp/old (the stubs)
    cp -r tests/upgrade /tmp/old/tests/
    cd /tmp/old && PYTHONPATH=/tmp/old python -m tests.upgrade.make_fixture OUT_DIR 360f72e

It starts both services in this process on OUT_DIR/session.sqlite3 and
OUT_DIR/delivery.sqlite3, writes `tests.upgrade.sample` through gRPC, reads
everything back with `tests.upgrade.reads` and stores that as
OUT_DIR/expected_reads.json. The upgrade test migrates a copy with the new code
and compares its reads to that file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from switchboard.delivery.v1 import delivery_service_pb2_grpc as dpb_grpc
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.harness import EventLoopThread, delivery_server, session_server
from tests.upgrade import reads, sample


def main(out_dir: Path, written_by: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("session.sqlite3", "delivery.sqlite3"):
        if (out_dir / name).exists():
            raise SystemExit(f"{out_dir / name} exists: start from an empty directory")
    loop = EventLoopThread()
    try:
        with (
            session_server(loop, f"sqlite:///{out_dir / 'session.sqlite3'}") as sessions,
            delivery_server(loop, f"sqlite:///{out_dir / 'delivery.sqlite3'}") as ledger,
        ):
            session_stub = spb_grpc.SessionServiceStub(sessions.channel)
            delivery_stub = dpb_grpc.DeliveryServiceStub(ledger.channel)
            head = sample.write_sessions(session_stub)
            instance_ids = sample.write_ledger(delivery_stub)
            expected = {
                "written_by": written_by,
                "head": head,
                "instance_ids": instance_ids,
                "sessions": reads.read_sessions(session_stub, head),
                "ledger": reads.read_ledger(delivery_stub, instance_ids),
            }
    finally:
        loop.close()
    (out_dir / "expected_reads.json").write_text(json.dumps(expected, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
