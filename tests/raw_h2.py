"""gRPC calls over a raw HTTP/2 connection (the `h2` package), for what grpc's own
client refuses to send: header values that are not ASCII or hold NUL and control
bytes, and requests left half-sent.

Nothing is faked: the bytes go over TCP to a real server, as a hostile client's would.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.settings

Headers = list[tuple[bytes, bytes]]


@dataclass
class RawAnswer:
    """What the server sent back on the call's stream."""

    #: grpc-status (None when the stream ended without one).
    status: int | None = None
    message: bytes = b""
    #: grpc-status-details-bin as sent (base64 of a google.rpc.Status).
    details: bytes = b""
    #: RST_STREAM's error code, if the server reset the stream.
    reset: int | None = None
    #: The server's SETTINGS, as received.
    settings: dict[int, int] = field(default_factory=dict)


def grpc_frame(message: bytes, announced: int | None = None) -> bytes:
    """A gRPC length-prefixed message; `announced` may claim more bytes than follow."""
    return struct.pack(">BI", 0, len(message) if announced is None else announced) + message


class RawConnection:
    """One HTTP/2 connection to a gRPC server, driven by hand."""

    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        host, _, port = address.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout_s)
        self.timeout_s = timeout_s
        config = h2.config.H2Configuration(
            client_side=True,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self.h2 = h2.connection.H2Connection(config)
        self.h2.initiate_connection()
        self.answers: dict[int, RawAnswer] = {}
        self.settings: dict[int, int] = {}
        self._flush()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def _flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def start_call(self, method: str, headers: Headers, body: bytes, end: bool = True) -> int:
        """Opens a stream for `method` with `headers` added and sends `body` (as much as
        flow control allows now); returns the stream id."""
        stream = self.h2.get_next_available_stream_id()
        self.answers[stream] = RawAnswer()
        self.h2.send_headers(
            stream,
            [
                (b":method", b"POST"),
                (b":scheme", b"http"),
                (b":path", method.encode()),
                (b":authority", b"switchboard"),
                (b"content-type", b"application/grpc"),
                (b"te", b"trailers"),
                *headers,
            ],
        )
        window = self.h2.local_flow_control_window(stream)
        self.h2.send_data(stream, body[:window], end_stream=end and len(body) <= window)
        self._flush()
        return stream

    def wait_for_answer(self, stream: int) -> RawAnswer:
        """Reads until the stream ends (trailers or reset); raises TimeoutError otherwise."""
        deadline = time.monotonic() + self.timeout_s
        answer = self.answers[stream]
        while answer.status is None and answer.reset is None:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                raise TimeoutError(f"no answer on stream {stream} in {self.timeout_s} s") from None
            if not data:
                raise ConnectionError("the server closed the connection")
            self._receive(data)
        return answer

    def wait_for_settings(self) -> dict[int, int]:
        deadline = time.monotonic() + self.timeout_s
        while not self.settings:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            data = self.sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection")
            self._receive(data)
        return self.settings

    def _receive(self, data: bytes) -> None:
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.RemoteSettingsChanged):
                changed = event.changed_settings.items()
                self.settings.update({key: setting.new_value for key, setting in changed})
            answer = self.answers.get(getattr(event, "stream_id", None) or 0)
            if answer is None:
                continue
            if isinstance(event, h2.events.StreamReset):
                answer.reset = event.error_code
            elif isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                _read_status(answer, event.headers)
        self._flush()


def _read_status(answer: RawAnswer, headers: object) -> None:
    for key, value in headers:  # type: ignore[attr-defined]
        if key == b"grpc-status":
            answer.status = int(value)
        elif key == b"grpc-message":
            answer.message = value
        elif key == b"grpc-status-details-bin":
            answer.details = value


def call(address: str, method: str, headers: Headers, body: bytes = b"") -> RawAnswer:
    """One whole unary call on a fresh connection."""
    with RawConnection(address) as connection:
        return connection.wait_for_answer(connection.start_call(method, headers, grpc_frame(body)))


MAX_CONCURRENT_STREAMS = h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS
