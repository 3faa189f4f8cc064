"""Metrics and access logs for every RPC, and the metrics endpoint.

Prometheus metrics are served on their own port; each call is counted and
timed by method and status code, and logged as one structured line with a
request id (the caller's `x-request-id`, or a fresh one).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from pythonjsonlogger.json import JsonFormatter

from switchboard.grpc_errors import WrappingInterceptor

access_log = logging.getLogger("switchboard.access")


def configure_logging(level: str, json_format: bool) -> None:
    handler = logging.StreamHandler()
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

    def observe(self, method: str, code: str, seconds: float, request_id: str) -> None:
        self.calls.labels(method, code).inc()
        self.latency.labels(method).observe(seconds)
        if code == "UNAUTHENTICATED":
            return  # counted; logged by auth, rate limited, so a flood cannot grow the log
        access_log.info(
            "rpc",
            extra={
                "method": method,
                "status": code,
                "duration_ms": round(seconds * 1000, 3),
                "request_id": request_id,
            },
        )


def _request_id(context: Any) -> str:
    metadata = dict(context.invocation_metadata() or ())
    given = metadata.get("x-request-id")
    return given if isinstance(given, str) and given else uuid.uuid4().hex[:16]


def _code(context: Any, failed: bool) -> str:
    code = context.code()
    if code is None:
        return "INTERNAL" if failed else "OK"
    return str(code.name)


class ObservabilityInterceptor(WrappingInterceptor):
    """Counts, times and logs every call with its final status (outermost interceptor)."""

    def __init__(self, metrics: RpcMetrics) -> None:
        super().__init__()
        self.metrics = metrics

    def wrap_unary(
        self, method: str, behavior: Callable[[Any, Any], Awaitable[Any]]
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def observed(request: Any, context: Any) -> Any:
            started, request_id, failed = time.perf_counter(), _request_id(context), True
            try:
                response = await behavior(request, context)
                failed = False
                return response
            finally:
                code = _code(context, failed)
                self.metrics.observe(method, code, time.perf_counter() - started, request_id)

        return observed

    def wrap_stream(
        self, method: str, behavior: Callable[[Any, Any], AsyncIterator[Any]]
    ) -> Callable[[Any, Any], AsyncIterator[Any]]:
        async def observed(request: Any, context: Any) -> AsyncIterator[Any]:
            started, request_id, failed = time.perf_counter(), _request_id(context), True
            try:
                async for response in behavior(request, context):
                    yield response
                failed = False
            finally:
                code = _code(context, failed)
                self.metrics.observe(method, code, time.perf_counter() - started, request_id)

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
