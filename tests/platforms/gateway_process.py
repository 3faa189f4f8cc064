"""A gateway process running a real platform adapter, for the crash tests.

python -m tests.platforms.gateway_process telegram|slack SESSION DELIVERY PLATFORM_BASE_URL
    [--hang] [--log-turns=FILE] [--hold-until=FILE] [--die-in-agent]

An `AsyncGateway` (claims and heartbeats every 0.3 s) with `TelegramAdapter`
polling the Bot API at the base URL, or `SlackAdapter` posting to it and taking
events on a port of its own, printed as "events: <url>". It prints "ready" once
booted and runs until SIGTERM (a graceful stop) or SIGKILL (the test's crash).
Its reply key, if any, comes from SWITCHBOARD_REPLY_KEY, as a deployed gateway's.
With --hang its agent never answers: the test kills it mid-turn. Else its agent
appends "<pid> <message>" to the --log-turns file at each turn, then thinks until
the --hold-until file exists, or dies there (--die-in-agent).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from switchboard_client.aio import AsyncDeliveryClient, AsyncSessionClient
from switchboard_client.async_gateway import AsyncGateway, Turn
from switchboard_client.platforms.slack import SlackAdapter
from switchboard_client.platforms.telegram import TelegramAdapter
from switchboard_client.testing import SlackStandIn, TelegramStandIn

from tests.platforms.conftest import BOT


async def answer(turn: Turn) -> str:
    content = turn.state.state.inbox[-1].message.content
    options = dict(arg.removeprefix("--").partition("=")[::2] for arg in sys.argv[5:])
    if "log-turns" in options:
        with Path(options["log-turns"]).open("a") as turns:
            print(os.getpid(), content, file=turns, flush=True)
    if "die-in-agent" in options:
        os.kill(os.getpid(), signal.SIGKILL)
    while "hold-until" in options and not Path(options["hold-until"]).exists():
        await asyncio.sleep(0.05)
    return f"answer to {content}"


async def thinking_forever(turn: Turn) -> str:
    await asyncio.Event().wait()
    raise AssertionError("unreachable")


async def main(
    platform: str, session_address: str, delivery_address: str, base_url: str, hang: bool = False
) -> None:
    stopped = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopped.set)
    adapter: TelegramAdapter | SlackAdapter
    if platform == "telegram":
        adapter = TelegramAdapter(TelegramStandIn.TOKEN, base_url=base_url, poll_timeout_s=1)
    else:
        adapter = SlackAdapter(SlackStandIn.TOKEN, SlackStandIn.SECRET, base_url=base_url)
    async with (
        AsyncSessionClient(session_address) as sessions,
        AsyncDeliveryClient(delivery_address) as ledger,
    ):
        agent = thinking_forever if hang else answer
        gateway = AsyncGateway(
            BOT, "main", sessions, ledger, [adapter], agent, heartbeat_s=0.3, claim_every_s=0.3
        )
        await gateway.start()
        if isinstance(adapter, TelegramAdapter):
            polling = asyncio.create_task(adapter.poll(gateway.handle))
            print("ready", flush=True)
            await stopped.wait()
            adapter.stop()
            await polling
        else:
            runner = await adapter.serve_events(gateway.handle, "127.0.0.1", 0)
            port = runner.addresses[0][1]
            print(f"events: http://127.0.0.1:{port}/", flush=True)
            print("ready", flush=True)
            await stopped.wait()
            await runner.cleanup()
        await gateway.stop()


if __name__ == "__main__":
    platform_name, session, delivery, platform_url = sys.argv[1:5]
    asyncio.run(main(platform_name, session, delivery, platform_url, "--hang" in sys.argv[5:]))
