"""The fault proxy itself: it forwards, cuts, and loses answers when told to."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from tests.tcp_proxy import Link, TcpProxy


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()
    listener.close()


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(4096):
            conn.sendall(data)


def _round_trip(address: str, payload: bytes) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(payload)
        return sock.recv(4096)


def test_forwards_with_latency(echo_server: tuple[str, int]) -> None:
    with TcpProxy(echo_server, delay_s=0.005) as proxy:
        assert _round_trip(proxy.address, b"hello") == b"hello"


def test_a_dropped_answer_resets_the_connection_after_the_request_arrived(
    echo_server: tuple[str, int],
) -> None:
    seen: list[int] = []

    def lose_every_answer(link: Link, data: bytes) -> bool:
        seen.append(link.sent_by_client)
        return False

    with TcpProxy(echo_server) as proxy:
        proxy.on_reply = lose_every_answer
        with pytest.raises((ConnectionError, TimeoutError)):
            answer = _round_trip(proxy.address, b"ping")
            if not answer:
                raise ConnectionResetError("closed without an answer")
    assert seen == [4], "the request reached the server before its answer was dropped"


def test_cut_resets_open_connections(echo_server: tuple[str, int]) -> None:
    with TcpProxy(echo_server) as proxy:
        host, port = proxy.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"x")
            assert sock.recv(16) == b"x"
            assert proxy.cut() == 1
            with pytest.raises((ConnectionError, TimeoutError)):
                sock.sendall(b"y")
                if not sock.recv(16):
                    raise ConnectionResetError("closed")
