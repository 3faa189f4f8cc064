"""One aio gRPC server per service: health, reflection, error mapping, graceful drain.

The server model is `grpc.aio`: an idle stream costs a coroutine, not a worker
thread, so one replica can hold hundreds of server-streaming watchers; storage
calls run on the `TransactionRunner`'s threads, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from prometheus_client.metrics_core import Metric

from switchboard.auth import AuthInterceptor, Grant, quiet_grpc_decode_errors
from switchboard.call_stream import CarriedCalls
from switchboard.concurrency import UnaryLimitInterceptor
from switchboard.deadlines import DeadlineInterceptor
from switchboard.grpc_errors import DomainErrorInterceptor
from switchboard.interceptor_chain import InterceptorChain, Stage
from switchboard.observability import (
    AccessLevel,
    AccessLog,
    ObservabilityInterceptor,
    RpcMetrics,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    listen: str = "127.0.0.1:0"
    #: Largest request accepted by gRPC itself; content limits are checked by
    #: the services so that an oversized field gets INVALID_ARGUMENT naming it.
    #: gRPC servers have no per-method receive limit (only clients get one, from a
    #: service config), so this one figure bounds every method.
    max_message_bytes: int = 16 * 1024 * 1024
    #: Unary calls beyond this many at once are answered RESOURCE_EXHAUSTED before
    #: their request is read (None: no limit). Streams (watchers, with their own cap),
    #: health checks and reflection are not counted (`switchboard.concurrency`).
    max_concurrent_rpcs: int | None = None
    #: Connections held at once per listening port; more are closed as accepted
    #: (gRPC's grpc.max_allowed_incoming_connections). None: no limit.
    max_connections: int | None = 1000
    #: Calls open at once on one HTTP/2 connection (SETTINGS_MAX_CONCURRENT_STREAMS:
    #: clients queue the ones beyond it). A gateway multiplexes its watchers over one
    #: channel, so hundreds must fit. None: gRPC's default (no limit).
    max_streams_per_connection: int | None = 1000
    #: HTTP/2 flow-control window per stream and per connection, fixed (BDP probing
    #: off): what a client may send that the server has not asked to read. gRPC's
    #: default probes the bandwidth and announces 4 MiB, which a caller without a token
    #: could fill on every stream before it is refused. A call being read is granted
    #: the rest of its message at once, whatever this is. None: gRPC's default.
    http2_window_bytes: int | None = 64 * 1024
    #: Seconds in-flight calls get to finish after SIGTERM.
    drain_grace_s: float = 10.0
    #: Connections are closed (gracefully) after this long, so that an L4
    #: load balancer spreads long-lived HTTP/2 connections over new replicas.
    max_connection_age_s: float = 300.0
    keepalive_time_s: float = 30.0
    #: Bearer tokens and what they may do; empty turns authentication off.
    auth: Mapping[str, Grant] = field(default_factory=dict)
    #: Counts and times every call when set.
    metrics: RpcMetrics | None = None
    #: Access lines on `switchboard.access`: every call, the failed ones, or none.
    access_log: AccessLevel = "all"
    #: PEM files: serve TLS with cert and key; with client_ca, require client
    #: certificates signed by it (mTLS).
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    #: Seconds between database probes for health checking (sooner after a call
    #: failed UNAVAILABLE), and how long one may take before it counts as failed.
    health_probe_interval_s: float = 1.0
    health_probe_timeout_s: float = 2.0
    #: Several processes listen on one port (SO_REUSEPORT: the kernel spreads new
    #: connections over them); off, a port another process holds is an error.
    share_port: bool = False

    def credentials(self) -> grpc.ServerCredentials | None:
        if self.tls_cert is None or self.tls_key is None:
            return None
        root = self.tls_client_ca.read_bytes() if self.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(self.tls_key.read_bytes(), self.tls_cert.read_bytes())],
            root_certificates=root,
            require_client_auth=root is not None,
        )


def channel_options(settings: ServerSettings) -> list[tuple[str, int]]:
    """gRPC's own limits for one server. Python cannot pass gRPC a resource quota
    (`grpc.resource_quota` is a C pointer and grpcio exports no way to make one), so
    memory is bounded by connections, streams per connection, message size and
    concurrent calls; calls without a valid token are refused before their request
    is read (see `switchboard.auth`)."""
    options = [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_connection_age_ms", int(settings.max_connection_age_s * 1000)),
        ("grpc.max_connection_age_grace_ms", int(settings.drain_grace_s * 1000)),
        ("grpc.keepalive_time_ms", int(settings.keepalive_time_s * 1000)),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.so_reuseport", 1 if settings.share_port else 0),
    ]
    if settings.max_connections is not None:
        options.append(("grpc.max_allowed_incoming_connections", settings.max_connections))
    if settings.max_streams_per_connection is not None:
        options.append(("grpc.max_concurrent_streams", settings.max_streams_per_connection))
    if settings.http2_window_bytes is not None:
        options.append(("grpc.http2.bdp_probe", 0))
        options.append(("grpc.http2.lookahead_bytes", settings.http2_window_bytes))
    return options


class ServiceUnit(Protocol):
    """A service ready to be mounted on a server."""

    #: Full gRPC service name, e.g. "switchboard.delivery.v1.DeliveryService".
    service_name: str

    def add_to_server(self, server: grpc.aio.Server) -> None: ...

    def close(self) -> None:
        """Releases storage after the server has drained."""
        ...

    def gauges(self) -> Iterable[Metric]:
        """State gauges (read from storage) for the metrics endpoint."""
        ...

    def probe(self) -> None:
        """Raises `switchboard.errors.Unavailable` unless storage can serve calls now."""
        ...


class _GenericHandlersOnly:
    """A server as generated `add_*_to_server` code sees it: each service is served
    through the generic handler that code adds, none of its methods registered
    (reflection's one method stays registered: it is mounted on the real server).

    Why: grpc's aio server keeps one task per registered method waiting for that
    method's next call, and its accept loop waits on all of them again after every call
    (`asyncio.wait` over ~50 tasks, most of the no-op's ~70k instructions over issue 25's
    baseline). The generic handler holds the same method handlers, served from one task."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    def add_registered_method_handlers(self, _service: str, _handlers: Any) -> None:
        """The generic handler added beside these holds the same handlers."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


class GrpcApp:
    """A started server hosting one service with health and reflection beside it."""

    def __init__(self, unit: ServiceUnit, settings: ServerSettings) -> None:
        self.unit = unit
        self.settings = settings
        self.port = 0
        self.health: HealthServicer | None = None
        self.server: grpc.aio.Server | None = None
        self._monitor: asyncio.Task[None] | None = None
        self._probe_now = asyncio.Event()
        self._last_probe_error = ""
        self._stopping = False
        #: The units' CallStream carriers, drained first when the server stops.
        self._carriers: list[CarriedCalls] = []
        # One thread: a probe stuck on a black-holed database never stacks up others.
        self._prober = ThreadPoolExecutor(max_workers=1, thread_name_prefix="health-probe")

    async def start(self) -> int:
        """Builds the server on the running event loop and starts listening."""
        settings = self.settings
        self.health = HealthServicer()
        auth = AuthInterceptor(settings.auth)
        interceptors: list[Stage] = [DomainErrorInterceptor()]
        if settings.max_concurrent_rpcs is not None:
            # Ours, not gRPC's maximum_concurrent_rpcs: that one counts watchers' streams.
            # Inside the error mapping, which answers a request it cannot read.
            interceptors.append(UnaryLimitInterceptor(settings.max_concurrent_rpcs))
        interceptors += [DeadlineInterceptor(on_unavailable=self._probe_now.set), auth]
        access = None if settings.access_log == "off" else AccessLog(settings.access_log)
        if settings.metrics is not None or access is not None:
            # Outermost, so that it sees the status the caller gets (RESOURCE_EXHAUSTED too).
            observer = ObservabilityInterceptor(settings.metrics, access, auth.principal_of)
            interceptors.insert(0, observer)
        quiet_grpc_decode_errors()
        chain = InterceptorChain(interceptors)
        self.server = grpc.aio.server(interceptors=[chain], options=channel_options(settings))
        mounts = cast(grpc.aio.Server, _GenericHandlersOnly(self.server))
        self.unit.add_to_server(mounts)
        # A unit with a CallStream serves the calls it carries through the same chain.
        carry_calls_through = getattr(self.unit, "carry_calls_through", None)
        if carry_calls_through is not None:
            carrier: CarriedCalls = carry_calls_through(chain)
            carrier.max_stream_age_s = settings.max_connection_age_s / 2
            self._carriers.append(carrier)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, mounts)
        # The real server: reflection picks its asyncio servicer by the server's type.
        reflection.enable_server_reflection(
            (
                self.unit.service_name,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self.server,
        )

        credentials = settings.credentials()
        self.port = (
            self.server.add_secure_port(settings.listen, credentials)
            if credentials is not None
            else self.server.add_insecure_port(settings.listen)
        )
        if self.port == 0:
            raise OSError(f"cannot listen on {settings.listen}")
        await self.server.start()
        await self._set_health(await self._storage_ok())
        self._monitor = asyncio.create_task(self._watch_storage())
        return self.port

    async def _set_health(self, serving: bool) -> None:
        assert self.health is not None
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", self.unit.service_name):
            await self.health.set(name, status)

    async def _storage_ok(self) -> bool:
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.run_in_executor(self._prober, self.unit.probe),
                self.settings.health_probe_timeout_s,
            )
        except Exception as exc:
            # The reason only: the backend has logged the fault's details once already.
            self._last_probe_error = getattr(exc, "reason", None) or type(exc).__name__
            return False
        return True

    async def _watch_storage(self) -> None:
        """Health follows the database: NOT_SERVING while `unit.probe()` fails (so
        readiness takes the replica out), SERVING again once it answers."""
        serving = True
        while not self._stopping:
            healthy = await self._storage_ok()
            if healthy != serving:
                if healthy:
                    log.warning("%s: the database answers again: SERVING", self.unit.service_name)
                else:
                    log.error(
                        "%s: the database cannot serve calls (%s): NOT_SERVING",
                        self.unit.service_name,
                        self._last_probe_error,
                    )
                await self._set_health(healthy)
                serving = healthy
            self._probe_now.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._probe_now.wait(), self.settings.health_probe_interval_s
                )

    async def stop(self) -> None:
        """NOT_SERVING first (load balancers stop sending), then drain, then close storage."""
        assert self.health is not None and self.server is not None, "stop() before start()"
        if self._monitor is not None:
            # A flag as well as cancel(): Python 3.11's wait_for can swallow a
            # cancellation that races its inner future's completion.
            self._stopping = True
            self._monitor.cancel()
            await asyncio.wait({self._monitor}, timeout=self.settings.health_probe_timeout_s + 1)
        await self.health.enter_graceful_shutdown()
        for carrier in self._carriers:  # streams end once their calls in flight are answered
            carrier.drain()
        await self.server.stop(self.settings.drain_grace_s)
        await asyncio.to_thread(self.unit.close)
        self._prober.shutdown(wait=False)

    @property
    def address(self) -> str:
        host = self.settings.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"


async def serve_until_signalled(
    apps: Sequence[GrpcApp], on_ready: Callable[[Sequence[GrpcApp]], None] | None = None
) -> None:
    """Starts the apps and runs until SIGTERM or SIGINT, then drains them all."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    for app in apps:
        await app.start()
    if on_ready is not None:
        on_ready(apps)
    await stop.wait()
    log.info("signal received: draining")
    await asyncio.gather(*(app.stop() for app in apps))
