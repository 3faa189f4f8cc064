"""One watcher's deadline never silences the other watchers of its replica (issue 21
item 3), on a real `switchboard serve session` process, on both backends.

The log tailer a replica shares between its watchers is started by the first watcher
to arrive. It must belong to no caller: when it inherited that caller's deadline, every
read it made after the deadline failed (`reading the log failed (DEADLINE_EXCEEDED);
retrying`) and no live event reached anyone for as long as a watcher stayed connected.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import pytest

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard.session.v1 import session_service_pb2_grpc as pb_grpc
from tests.chaos.common import DEADLINE, Processes, channel_to, rpc_code, wait_for
from tests.session.conftest import append, create_agent, resolve, user_message, web

pytestmark = [pytest.mark.chaos, pytest.mark.slow, DEADLINE]

#: The first watcher's deadline, in seconds.
SHORT_DEADLINE_S = 2.0
#: How long a live event may take to reach the watcher that has no deadline: the
#: replica's poll interval (1 s) many times over, for a loaded 2-core machine.
DELIVERY_BOUND_S = 15.0


class _Collected:
    """A WatchEvents stream read on a thread of its own: its sequences and how it ended."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.sequences: list[int] = []
        self.ended: grpc.StatusCode | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for item in self.stream:
                self.sequences.append(item.event.sequence)
        except grpc.RpcError as error:
            self.ended = rpc_code(error)

    def close(self) -> None:
        self.stream.cancel()
        self._thread.join(timeout=10)


@contextmanager
def _watching(
    stub: pb_grpc.SessionServiceStub, after: int, timeout: float | None = None
) -> Iterator[_Collected]:
    request = pb.WatchEventsRequest(after_sequence=after)
    collected = _Collected(stub.WatchEvents(request, timeout=timeout))
    try:
        yield collected
    finally:
        collected.close()


def test_a_watchers_deadline_leaves_the_replicas_other_watchers_live(
    database_url: str, processes: Processes
) -> None:
    server = processes.server(database_url, service="session")
    with channel_to(server.address) as channel:
        stub = pb_grpc.SessionServiceStub(channel)
        create_agent(stub)
        session_id = resolve(stub, **web()).session.session_id
        head = append(stub, session_id, user_message("start")).events[-1].sequence
        with _watching(stub, head, timeout=SHORT_DEADLINE_S) as short:
            # The short watcher is the first: the replica's tailer starts inside its call.
            first = append(stub, session_id, user_message("heard by the first")).events[-1]
            wait_for(lambda: first.sequence in short.sequences, 10.0, "the first watcher")
            with _watching(stub, first.sequence) as long:
                wait_for(lambda: short.ended is not None, 10.0, "the first deadline to pass")
                assert short.ended == grpc.StatusCode.DEADLINE_EXCEEDED
                later = [
                    append(stub, session_id, user_message(f"after the deadline {n}"))
                    .events[-1]
                    .sequence
                    for n in range(3)
                ]
                wait_for(
                    lambda: long.sequences == later,
                    DELIVERY_BOUND_S,
                    f"the watcher without a deadline to hear {later} (it heard {long.sequences})",
                )
