"""Platform adapters on the platforms' own SDKs, for `AsyncGateway`.

Each module needs its extra (the SDK is imported there, not here):

- `switchboard_client.platforms.telegram.TelegramAdapter`:
  `pip install "switchboard-client[telegram]"` (python-telegram-bot).
  Inbound by getUpdates long polling (`poll`), replies with sendMessage.
- `switchboard_client.platforms.slack.SlackAdapter`:
  `pip install "switchboard-client[slack]"` (slack_sdk's AsyncWebClient on aiohttp).
  Inbound by the Events API over HTTP (`events_app` / `serve_events`), replies
  with chat.postMessage.

Both follow the adapter contract of `switchboard_client.adapters`: neither
platform drops a repeated send, so `idempotent_sends` is False, and neither can
say afterwards whether a send arrived, so a reply recovered after a crash
between send and mark is re-sent with the marker. Their errors map onto
`SendFailed`: flood control is retryable after the platform's own delay, a
refusal about the chat or the bot's rights is not, a network error is
(the message may have gone out: the retry carries the marker).
"""
