"""Telegram for `AsyncGateway`, on python-telegram-bot (extra `telegram`).

    adapter = TelegramAdapter(token)
    gateway = AsyncGateway("my-bot", "main", sessions, ledger, [adapter], agent)
    await gateway.start()                 # connect() calls getMe: a bad token fails here
    await adapter.poll(gateway.handle)    # getUpdates long polling until `stop()`

What it covers of the Bot API: getMe (connect), getUpdates long polling for
`message` updates with text (inbound), sendMessage with `message_thread_id` for
forum topics (replies). Edited messages, channel posts, media, callback
queries, webhooks and message splitting (a reply over 4,096 characters is
refused by Telegram: not retryable) are not handled.

Inbound delivery. An update is confirmed to Telegram by the next getUpdates
(its `offset`), which this loop sends at once, before the update's turn has run:
turns run in tasks, in order per chat. So a crash after that never brings the
update back to a gateway that may since have redelivered its reply (Telegram
has no idempotency key, and a second turn for the same message would send a
second reply). The cost is a small window, from getUpdates to the inbox post
(a few RPCs), in which a crash loses the message, as does a turn that fails
before the post (the services unreachable: logged); after the post,
Switchboard's resume mark carries the turn over.

Sends. Telegram has no idempotency key and no way to ask whether a message
went out, so `idempotent_sends` is False and `was_delivered` is absent: a reply
cut off between send and mark is re-sent with `RECOVERED_MARKER`. Errors:
429 (`parameters.retry_after`) is retryable after that delay; 400 (chat not
found, message too long, chat migrated) and 403 (bot blocked or kicked) and a
rejected token are not; network errors and timeouts are retryable (the message
may have gone out: the retry carries the marker).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import warnings
from collections.abc import Awaitable, Callable

try:
    from telegram import Bot, Message, Update
    from telegram.error import (
        BadRequest,
        ChatMigrated,
        Forbidden,
        InvalidToken,
        NetworkError,
        RetryAfter,
        TelegramError,
    )
    from telegram.request import HTTPXRequest
except ImportError as missing:  # the extra is not installed: say which one
    raise ImportError(
        f"switchboard_client.platforms.telegram needs python-telegram-bot ({missing.name} is "
        "missing): pip install 'switchboard-client[telegram]'"
    ) from missing

from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_client.adapters import SendFailed
from switchboard_client.async_gateway import Inbound

log = logging.getLogger("switchboard_client.platforms.telegram")

Handler = Callable[[Inbound], Awaitable[object]]

CHAT_TYPES = {
    "private": pb.CHAT_TYPE_DM,
    "group": pb.CHAT_TYPE_GROUP,
    "supergroup": pb.CHAT_TYPE_GROUP,
    "channel": pb.CHAT_TYPE_CHANNEL,
}


class TelegramAdapter:
    """A Telegram bot: `poll` feeds the gateway, `send` answers (see the module docstring)."""

    name = "telegram"
    idempotent_sends = False

    def __init__(
        self,
        token: str,
        *,
        base_url: str = "https://api.telegram.org/bot",
        poll_timeout_s: int = 30,
        retry_poll_after_s: float = 2.0,
        bot: Bot | None = None,
    ) -> None:
        """`base_url` as python-telegram-bot's (the token is appended; a local Bot API
        server or a test stand-in). `poll_timeout_s` is getUpdates' long-poll time."""
        self.poll_timeout_s = poll_timeout_s
        self.retry_poll_after_s = retry_poll_after_s
        # Two pools: a long poll must never hold the connection a reply needs.
        self.bot = bot or Bot(
            token,
            base_url=base_url,
            request=HTTPXRequest(connection_pool_size=8),
            get_updates_request=HTTPXRequest(read_timeout=poll_timeout_s + 10.0),
        )
        self._stop = asyncio.Event()
        #: The newest turn task of each chat: a chat's messages are answered in order.
        self._chains: dict[str, asyncio.Task[None]] = {}

    async def connect(self) -> None:
        """getMe: checks the token and that the Bot API answers."""
        await self.bot.initialize()

    async def close(self) -> None:
        await self.bot.shutdown()

    async def send(self, chat_id: str, thread_id: str, text: str, idempotency_key: str) -> str:
        """sendMessage; returns "<chat id>:<message id>". Raises SendFailed."""
        try:
            message = await self.bot.send_message(
                chat_id=chat_id,
                text=text,
                message_thread_id=int(thread_id) if thread_id else None,
            )
        except TelegramError as error:
            raise send_failed(error) from error
        return f"{message.chat.id}:{message.message_id}"

    # -- inbound -----------------------------------------------------------------------

    def inbound(self, update: Update) -> Inbound | None:
        """The gateway's Inbound for a text message; None for anything else."""
        message = update.message
        if message is None or message.text is None:
            return None
        return Inbound(source(message), message.text, message_ref=message_ref(message))

    async def poll(self, handle: Handler) -> None:
        """getUpdates long polling until `stop()`; each message becomes `handle(inbound)`
        (the gateway's `handle`), in order per chat. Returns once every turn it started
        has ended. A rejected token ends it with InvalidToken; other errors are retried."""
        self._stop.clear()
        offset: int | None = None
        try:
            while not self._stop.is_set():
                updates = await self._get_updates(offset)
                for update in updates:
                    offset = update.update_id + 1
                    inbound = self.inbound(update)
                    if inbound is not None:
                        self._start_turn(inbound, handle)
        finally:
            await asyncio.gather(*self._chains.values(), return_exceptions=True)

    def stop(self) -> None:
        """Ends `poll` (at once: a long poll in flight is cancelled)."""
        self._stop.set()

    async def _get_updates(self, offset: int | None) -> tuple[Update, ...]:
        """One long poll, cut short by `stop()`; () after an error it will retry."""
        poll = asyncio.ensure_future(
            self.bot.get_updates(
                offset=offset, timeout=self.poll_timeout_s, allowed_updates=["message"]
            )
        )
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({poll, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if not poll.done():
            # Updates a cancelled poll would have returned stay unconfirmed: the next
            # poller gets them.
            poll.cancel()
            await asyncio.gather(poll, return_exceptions=True)
            return ()
        try:
            return poll.result()
        except InvalidToken:
            raise
        except TelegramError as error:  # network, 5xx, 409 (another poller or a webhook)
            log.warning("getUpdates failed (%s); polling again shortly", error)
            await asyncio.sleep(self.retry_poll_after_s)
            return ()

    def _start_turn(self, inbound: Inbound, handle: Handler) -> None:
        chat = inbound.source.chat_id
        task = asyncio.create_task(_after(self._chains.get(chat), handle, inbound))
        self._chains[chat] = task

        def forget(done: asyncio.Task[None]) -> None:
            if self._chains.get(chat) is done:
                del self._chains[chat]

        task.add_done_callback(forget)


async def _after(previous: asyncio.Task[None] | None, handle: Handler, inbound: Inbound) -> None:
    """Runs one turn after the chat's previous one; its failure is logged, not raised."""
    if previous is not None:
        await asyncio.gather(previous, return_exceptions=True)
    try:
        await handle(inbound)
    except Exception:
        log.exception("the turn for telegram message %s failed", inbound.message_ref)


def source(message: Message) -> pb.Source:
    """Where a message came from, as routing keys read it."""
    chat = message.chat
    user = message.from_user
    # message_thread_id is a forum topic only when is_topic_message; in other groups
    # it names a reply chain, into which sendMessage cannot post.
    topic = message.message_thread_id if message.is_topic_message else None
    return pb.Source(
        transport="telegram",
        chat_type=CHAT_TYPES.get(chat.type, pb.CHAT_TYPE_UNSPECIFIED),
        chat_id=str(chat.id),
        thread_id=str(topic) if topic else "",
        user_id=str(user.id) if user else "",
    )


def message_ref(message: Message) -> str:
    """Message ids are unique per chat only."""
    return f"{message.chat.id}:{message.message_id}"


def send_failed(error: TelegramError) -> SendFailed:
    """The contract's verdict on a Bot API error (order matters: BadRequest is a
    NetworkError in python-telegram-bot)."""
    if isinstance(error, RetryAfter):
        return SendFailed(f"telegram 429: {error}", True, retry_after_seconds(error))
    if isinstance(error, ChatMigrated):
        return SendFailed(f"telegram: {error}", retryable=False)
    if isinstance(error, BadRequest | Forbidden | InvalidToken):
        return SendFailed(f"telegram: {error}", retryable=False)
    if isinstance(error, NetworkError):
        return SendFailed(f"telegram network error: {error}", retryable=True)
    return SendFailed(f"telegram: {error}", retryable=True)


def retry_after_seconds(error: RetryAfter) -> float:
    """`retry_after` is an int or a timedelta by PTB_TIMEDELTA (v22.2's migration); read
    either without its deprecation warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        value = error.retry_after
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


__all__ = ["TelegramAdapter", "message_ref", "send_failed", "source"]
