"""Serving the console: alone (`switchboard console`), or beside the services in one
process (`switchboard serve all --console-listen ADDR`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Generator, Sequence

import uvicorn

from switchboard.server import GrpcApp, serve_until_signalled
from switchboard_console.app import create_app
from switchboard_console.web import Console, ConsoleSettings


def split_listen(listen: str) -> tuple[str, int]:
    """ "host:port" (IPv6 hosts in brackets) as uvicorn takes them."""
    host, separator, port = listen.rpartition(":")
    if not separator or not port.isdigit() or not host:
        raise ValueError(f"{listen!r}: use HOST:PORT, e.g. 127.0.0.1:8233")
    return host.strip("[]"), int(port)


class _Server(uvicorn.Server):
    """uvicorn's server without its signal handlers: whoever runs it stops it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class ConsoleServer:
    """The console on an event loop that someone else runs and stops."""

    def __init__(self, settings: ConsoleSettings) -> None:
        host, port = split_listen(settings.listen)
        app = create_app(settings)
        #: The console's parts (its logins, its live tail), for whoever runs it.
        self.console: Console = app.state.console
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            access_log=False,
            lifespan="on",
        )
        self.server = _Server(config)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        """Serves until `stop`; answers the address it listens on."""
        self._task = asyncio.create_task(self.server.serve(), name="switchboard-console")
        while not self.server.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
                raise RuntimeError("the console stopped before it started")
            await asyncio.sleep(0.02)
        socket = self.server.servers[0].sockets[0]
        host, port = socket.getsockname()[:2]
        return f"{host}:{port}"

    async def stop(self) -> None:
        if self._task is None:
            return
        self.server.should_exit = True
        await self._task


def run(settings: ConsoleSettings, announce: Callable[[str], None]) -> None:
    """Serves the console until SIGTERM or Ctrl-C."""
    host, port = split_listen(settings.listen)
    config = uvicorn.Config(
        create_app(settings), host=host, port=port, log_level="info", lifespan="on"
    )
    server = uvicorn.Server(config)

    async def main() -> None:
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            bound = server.servers[0].sockets[0].getsockname()
            announce(f"http://{bound[0]}:{bound[1]}")
        await task

    asyncio.run(main())


async def serve_with_console(
    apps: Sequence[GrpcApp],
    announce: Callable[[Sequence[GrpcApp]], None],
    listen: str,
    read_only: bool,
    announce_console: Callable[[str], None],
) -> None:
    """`serve_until_signalled`, with the console started once the services listen and
    stopped after them."""
    started: list[ConsoleServer] = []

    def ready(apps_started: Sequence[GrpcApp]) -> None:
        announce(apps_started)
        addresses = {app.unit.service_name.rsplit(".", 1)[-1]: app.address for app in apps_started}
        settings = ConsoleSettings(
            session_target=addresses["SessionService"],
            delivery_target=addresses["DeliveryService"],
            listen=listen,
            read_only=read_only,
        )
        console = ConsoleServer(settings)
        started.append(console)

        async def start() -> None:
            announce_console(f"http://{await console.start()}")

        asyncio.get_running_loop().create_task(start())

    try:
        await serve_until_signalled(apps, ready)
    finally:
        for console in started:
            await console.stop()
