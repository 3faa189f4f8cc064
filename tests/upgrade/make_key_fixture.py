"""Writes the routing-key fixture: a SessionService database whose keys collide.

Run it with the release that had the colliding keys (commit 89c0bf6) first on the
path, as tests/upgrade/make_fixture.py describes for the earlier fixture:

    git archive 89c0bf6 | tar -x -C /tmp/old
    cd /tmp/old && python -m grpc_tools.protoc --proto_path protos --python_out=. \
        --grpc_python_out=. protos/switchboard/*/v1/*.proto   (that release's stubs)
    cp -r tests/upgrade /tmp/old/tests/
    cd /tmp/old && PYTHONPATH=/tmp/old python -m tests.upgrade.make_key_fixture OUT_DIR

It serves OUT_DIR/session.sqlite3 in this process, writes `tests.upgrade.key_sample`
through gRPC and stores what that returned, and every session as the old release
read it, in OUT_DIR/written.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from switchboard.session.v1 import session_service_pb2 as spb
from switchboard.session.v1 import session_service_pb2_grpc as spb_grpc
from tests.harness import EventLoopThread, session_server
from tests.upgrade import key_sample


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    database = out_dir / "session.sqlite3"
    if database.exists():
        raise SystemExit(f"{database} exists: start from an empty directory")
    loop = EventLoopThread()
    try:
        with session_server(loop, f"sqlite:///{database}") as sessions:
            stub = spb_grpc.SessionServiceStub(sessions.channel)
            written = key_sample.write(stub)
            written["read"] = key_sample.read_all(stub)
            head = stub.CreateCheckpoint(spb.CreateCheckpointRequest(label="fixture-head"))
            written["head"] = head.checkpoint.sequence
    finally:
        loop.close()
    (out_dir / "written.json").write_text(json.dumps(written, indent=1, sort_keys=True))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
