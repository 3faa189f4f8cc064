"""A TCP proxy on 127.0.0.1 for fault tests and benchmarks: latency, black holes, cuts,
and answers lost after their request went through.

Put it between a client and a server (gRPC, or the services and PostgreSQL):

    with TcpProxy(("127.0.0.1", 5432)) as proxy:
        proxy.delay_s = 0.010            # 10 ms each way: 20 ms more per round trip
        proxy.blackhole = True           # bytes stop flowing; connections stay open
        proxy.cut()                      # every open connection is reset
        proxy.on_reply = policy          # decide per server->client chunk (lost answers)

Latency is modelled per chunk with a delivery time, not a sleep per chunk, so pipelined
traffic is delayed once, not once per chunk queued before it.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType

_CHUNK = 65536


@dataclass(eq=False)  # compared and hashed by identity: links live in a set
class Link:
    """One proxied connection: what the client sent so far, for reply policies."""

    client: socket.socket
    server: socket.socket
    sent_by_client: int = 0
    closed: threading.Event = field(default_factory=threading.Event)

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                # RST rather than FIN: the peer sees a dropped connection at once.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading it
            with contextlib.suppress(OSError):
                sock.close()


#: Given the link and a chunk the server sent, True forwards it; False drops the link
#: instead (the client never gets that answer; the server did get the request).
ReplyPolicy = Callable[[Link, bytes], bool]


class TcpProxy:
    def __init__(self, target: tuple[str, int], delay_s: float = 0.0) -> None:
        self.target = target
        self.delay_s = delay_s
        self.blackhole = False
        self.on_reply: ReplyPolicy | None = None
        self._links: set[Link] = set()
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stopping = False
        threading.Thread(target=self._accept, daemon=True, name="tcp-proxy-accept").start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> int:
        """Resets every open connection; returns how many."""
        with self._lock:
            links, self._links = self._links, set()
        for link in links:
            link.close()
        return len(links)

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = Link(client, server)
            with self._lock:
                self._links.add(link)
            self._pump(link, client, server, upstream=True)
            self._pump(link, server, client, upstream=False)

    def _pump(self, link: Link, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        """A reader thread stamps each chunk with its delivery time; a writer sends it then."""
        pending: queue.SimpleQueue[tuple[float, bytes] | None] = queue.SimpleQueue()

        def read() -> None:
            try:
                while not link.closed.is_set():
                    data = source.recv(_CHUNK)
                    if not data:
                        break
                    pending.put((time.monotonic() + self.delay_s, data))
            except OSError:
                pass
            pending.put(None)

        def write() -> None:
            try:
                while (item := pending.get()) is not None:
                    due, data = item
                    while (wait := due - time.monotonic()) > 0:
                        time.sleep(wait)
                    while self.blackhole and not link.closed.is_set():
                        time.sleep(0.01)  # held, as a dead network holds packets
                    if upstream:
                        link.sent_by_client += len(data)
                    elif self.on_reply is not None and not self.on_reply(link, data):
                        break
                    sink.sendall(data)
            except OSError:
                pass
            link.close()
            with self._lock:
                self._links.discard(link)

        name = "up" if upstream else "down"
        threading.Thread(target=read, daemon=True, name=f"tcp-proxy-{name}-read").start()
        threading.Thread(target=write, daemon=True, name=f"tcp-proxy-{name}-write").start()


class ReplyCounter:
    """An `on_reply` policy that passes every chunk and counts them: against a
    synchronous client such as Postgres', one chunk per round trip."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()

    def __call__(self, link: Link, data: bytes) -> bool:
        with self._lock:
            self.count += 1
        return True

    def per_call(self, calls: int, run: Callable[[int], object]) -> float:
        """Round trips per call of `run(n)` over `calls` calls."""
        self.count = 0
        for n in range(calls):
            run(n)
        return self.count / calls
