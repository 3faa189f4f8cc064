"""Metrics and access logs for every RPC, and the metrics endpoint.

Every call is logged as one structured line (method, status, duration, request
id, principal) on the `switchboard.access` logger, whether or not metrics are
on: `--access-log all` (the default), `errors` (calls that did not end OK) or
`off`. The request id is the caller's `x-request-id`, or a fresh one. With
`--metrics-listen`, each call is also counted and timed by method and status
code, served on its own port.

A call its caller ended (cancelled, or abandoned at its deadline) is logged and
counted with the status the caller saw, CANCELLED or DEADLINE_EXCEEDED: gRPC then
cancels the handler without a status of the server's, and INTERNAL would page an
operator for every closed browser tab.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, Literal, TextIO

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from pythonjsonlogger.json import JsonFormatter

from switchboard.grpc_errors import WrappingInterceptor

access_log = logging.getLogger("switchboard.access")

#: Which calls get an access line: every call, the ones not ending OK, or none.
AccessLevel = Literal["all", "errors", "off"]
ACCESS_LEVELS: tuple[AccessLevel, ...] = ("all", "errors", "off")


#: How long an INFO line (an access line, say) may wait in the buffer before it is written.
FLUSH_INTERVAL_S = 0.1


def _buffered_stderr() -> TextIO:
    """A buffered writer on stderr's descriptor (sys.stderr itself is line buffered);
    sys.stderr when it has none (replaced by a test runner, say)."""
    try:
        descriptor = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return sys.stderr
    return open(  # lives as long as the process's logging
        descriptor, "w", buffering=64 * 1024, encoding="utf-8", errors="backslashreplace",
        closefd=False,
    )  # fmt: skip


class BatchingStreamHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes log lines to stderr in batches: INFO and below at most `interval` s
    after they were logged, WARNING and above at once (with everything before them,
    so the order is kept).

    Why: an access line per call, written and flushed alone, cost a write(2) per RPC
    and woke whatever reads the pipe (a log collector) as often. Batched, a busy
    server writes ten times a second (`python -m bench --only feature-costs` measures what
    the access log still costs). The price: a process killed with SIGKILL loses up to
    `interval` s of INFO lines; an orderly exit (SIGTERM, `logging.shutdown`) writes
    them all.
    """

    def __init__(self, interval: float = FLUSH_INTERVAL_S) -> None:
        super().__init__(_buffered_stderr())
        self.interval = interval
        self._stopping = threading.Event()
        threading.Thread(target=self._flush_every_interval, name="log-flush", daemon=True).start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + self.terminator)
            if record.levelno >= logging.WARNING:
                self.stream.flush()
        except Exception:
            self.handleError(record)

    def _flush_every_interval(self) -> None:
        while not self._stopping.wait(self.interval):
            self.flush()

    def close(self) -> None:
        self._stopping.set()
        self.flush()
        super().close()


def configure_logging(level: str, json_format: bool) -> None:
    # No line shows the caller's file, function, thread or process, so records need
    # not collect them: walking the stack for the caller alone was a sixth of an
    # access line's cost (the switches of the logging HOWTO's "Optimization").
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = BatchingStreamHandler()
    if json_format:
        handler.setFormatter(
            JsonFormatter(
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for replaced in root.handlers:
        if isinstance(replaced, BatchingStreamHandler):
            replaced.close()  # writes what it holds, stops its thread
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


class RpcMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter(
            "switchboard_rpc_total", "RPCs handled.", ["method", "code"], registry=registry
        )
        self.latency = Histogram(
            "switchboard_rpc_duration_seconds",
            "RPC handling time.",
            ["method"],
            registry=registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
        )

    def observe(self, method: str, code: str, seconds: float) -> None:
        self.calls.labels(method, code).inc()
        self.latency.labels(method).observe(seconds)


#: Health checks and reflection: logged only when they fail.
QUIET_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


class AccessLog:
    """One line per finished call, at INFO (`--log-level WARNING` silences them too)."""

    def __init__(self, level: AccessLevel = "all") -> None:
        self.level = level

    def wants(self, method: str, code: str) -> bool:
        """Whether this call gets a line (checked before its principal is looked up)."""
        if self.level == "off" or (self.level == "errors" and code == "OK"):
            return False
        if code == "UNAUTHENTICATED":
            return False  # logged by auth, rate limited, so a flood cannot grow the log
        if code == "OK" and method.startswith(QUIET_PREFIXES):
            return False  # probes every few seconds would drown the calls that matter
        return access_log.isEnabledFor(logging.INFO)

    def write(
        self, method: str, code: str, seconds: float, request_id: str, principal: str
    ) -> None:
        access_log.info(
            "rpc %s %s %.1f ms request_id=%s principal=%s",
            method,
            code,
            seconds * 1000,
            request_id,
            principal or "-",
            extra={
                "method": method,
                "status": code,
                "duration_ms": round(seconds * 1000, 3),
                "request_id": request_id,
                "principal": principal,
            },
        )


def _request_id(context: Any) -> str:
    metadata = dict(context.invocation_metadata() or ())
    given = metadata.get("x-request-id")
    return given if isinstance(given, str) and given else uuid.uuid4().hex[:16]


#: How a handler learns that its caller ended the call: gRPC cancels its task
#: (CancelledError), or stops pulling answers from its generator (GeneratorExit).
_ENDED_BY_CALLER = (asyncio.CancelledError, GeneratorExit)
#: A call ended by its caller with less than this left of its deadline was ended by the
#: deadline: a client cancels at its own deadline, which comes a network delay before
#: the server's (the wire says CANCEL either way).
DEADLINE_SLACK_S = 0.25


#: How a handler ended: it answered, it raised, or its caller ended the call.
Ending = Literal["answered", "raised", "ended_by_caller"]


def _code(context: Any, ending: Ending) -> str:
    code = context.code()
    if code is not None:
        return str(code.name)
    if ending == "ended_by_caller":
        remaining = context.time_remaining()
        at_deadline = remaining is not None and remaining < DEADLINE_SLACK_S
        return "DEADLINE_EXCEEDED" if at_deadline else "CANCELLED"
    return "INTERNAL" if ending == "raised" else "OK"


#: The principal a call's metadata authenticates ("" with authentication off, "-"
#: for a credential that is refused).
PrincipalOf = Callable[[Any], str]


class ObservabilityInterceptor(WrappingInterceptor):
    """Times every call and logs and counts it with its final status (outermost
    interceptor: the status is the one the caller gets)."""

    def __init__(
        self,
        metrics: RpcMetrics | None,
        access: AccessLog | None = None,
        principal_of: PrincipalOf = lambda _metadata: "",
    ) -> None:
        super().__init__()
        self.metrics = metrics
        self.access = access
        self.principal_of = principal_of

    def _finished(
        self, method: str, context: Any, ending: Ending, started: float, rid: str
    ) -> None:
        code, seconds = _code(context, ending), time.perf_counter() - started
        if self.metrics is not None:
            self.metrics.observe(method, code, seconds)
        if self.access is not None and self.access.wants(method, code):
            principal = self.principal_of(context.invocation_metadata())
            self.access.write(method, code, seconds, rid, principal)

    def wrap_unary(
        self, method: str, behavior: Callable[[Any, Any], Awaitable[Any]]
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def observed(request: Any, context: Any) -> Any:
            started, request_id = time.perf_counter(), _request_id(context)
            ending: Ending = "raised"
            try:
                response = await behavior(request, context)
                ending = "answered"
                return response
            except _ENDED_BY_CALLER:
                ending = "ended_by_caller"
                raise
            finally:
                self._finished(method, context, ending, started, request_id)

        return observed

    def wrap_stream(
        self, method: str, behavior: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def observed(request: Any, context: Any) -> AsyncIterator[Any]:
            started, request_id = time.perf_counter(), _request_id(context)
            ending: Ending = "raised"
            try:
                async for response in behavior(request, context):
                    yield response
                ending = "answered"
            except _ENDED_BY_CALLER:
                ending = "ended_by_caller"
                raise
            finally:
                self._finished(method, context, ending, started, request_id)

        return observed


def serve_metrics(registry: CollectorRegistry, listen: str) -> int:
    """Starts the Prometheus endpoint on a daemon thread; returns its port."""
    host, _, port = listen.rpartition(":")
    server, _thread = start_http_server(int(port), addr=host or "0.0.0.0", registry=registry)
    return int(server.server_port)


class StateCollector(Collector):
    """Gauges read from storage at scrape time (ledger rows, log head, ...)."""

    def __init__(self, gauges: Callable[[], Iterable[Metric]]) -> None:
        self.gauges = gauges

    def collect(self) -> Iterable[Metric]:
        try:
            yield from self.gauges()
        except Exception:  # a scrape must not break on a busy or closed database
            logging.getLogger(__name__).exception("collecting state gauges failed")
