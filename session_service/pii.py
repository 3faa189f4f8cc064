"""Personal ids hashed before they are stored, for agents with `settings.redact_pii`.

A platform user id is stored as `user_<12 hex>`, a chat id as `<platform>:<12 hex>`
and a thread id as `thread_<12 hex>`: the first 48 bits of HMAC-SHA256(server key,
id). Threads count as personal: a thread of a DM, or a forum topic a person opened,
is as telling as the chat, and gateways seal the raw ones in the reply target. A
message's `message_ref` is stored as `ref_<24 hex>` (96 bits: distinct messages of a
conversation never share one): platforms' message ids name their chat (Telegram's
and Slack's adapters give `<chat id>:<message id>`). The key
is what makes the digest one-way in practice: platform ids are short (a Telegram
user id has about ten digits), so an unkeyed digest is reversed by trying every
id in seconds. Without a key the digest is sha256(id), as before keys existed,
so that routes stored then still resolve; the service warns about it at start-up.

Redaction is idempotent: a value already in redacted shape is kept, because
forks made by older releases copied stored history and a gateway may hand back
an id it read. A message sender of the form `agent:<name>` names an agent, not a
person, and is kept too.

Setting or changing the key changes every redacted routing key: conversations
that were routed before start fresh sessions (the old ones stay readable by id).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field
from pathlib import Path

from switchboard import secret_checks

#: The shortest server key accepted: 128 bits, so the key cannot be guessed either.
MIN_KEY_BYTES = 16
_DIGEST_CHARS = 12
_REDACTED_USER = re.compile(rf"user_[0-9a-f]{{{_DIGEST_CHARS}}}")
_REDACTED_THREAD = re.compile(rf"thread_[0-9a-f]{{{_DIGEST_CHARS}}}")
_REF_DIGEST_CHARS = 24
_REDACTED_REF = re.compile(rf"ref_[0-9a-f]{{{_REF_DIGEST_CHARS}}}")
_DIGEST = re.compile(rf"[0-9a-f]{{{_DIGEST_CHARS}}}")
#: A sender naming an agent (`agent:<agent name>`, names as `sessions.agent_name`).
_AGENT_SENDER = re.compile(r"agent:[a-z0-9][a-z0-9_-]{0,62}")

UNKEYED_WARNING = (
    "no PII key is set (--pii-key-file, SWITCHBOARD_PII_KEY_FILE or SWITCHBOARD_PII_KEY): "
    "agents with settings.redact_pii store user and chat ids as unkeyed sha256 digests, "
    "which anyone who can read the database reverses by brute force (a Telegram user id "
    "in seconds). Set a secret key of at least 16 bytes; note that setting it starts "
    "fresh sessions for conversations routed before."
)


class PiiKeyRefused(ValueError):
    """The configured key cannot be used; the message says what to fix."""


@dataclass(frozen=True)
class Redactor:
    """Hashes platform ids with the server's key (None: unkeyed, as before keys)."""

    key: bytes | None = field(default=None, repr=False)  # never in a log line or traceback

    def __post_init__(self) -> None:
        if self.key is not None and len(self.key) < MIN_KEY_BYTES:
            raise PiiKeyRefused(
                f"the PII key is {len(self.key)} bytes long; it must be at least "
                f"{MIN_KEY_BYTES} bytes (e.g. `openssl rand -hex 32`)"
            )

    @property
    def keyed(self) -> bool:
        return self.key is not None

    def digest(self, value: str, chars: int = _DIGEST_CHARS) -> str:
        data = value.encode("utf-8")
        if self.key is None:
            return hashlib.sha256(data).hexdigest()[:chars]
        return hmac.new(self.key, data, hashlib.sha256).hexdigest()[:chars]

    def user(self, user_id: str) -> str:
        """`user_<12 hex>`; empty and already redacted ids are kept."""
        if not user_id or is_redacted_user(user_id):
            return user_id
        return f"user_{self.digest(user_id)}"

    def sender(self, sender: str) -> str:
        """A message's sender as stored: a person's id redacted like a user id."""
        return self.user(sender) if sender_is_raw(sender) else sender

    def chat(self, platform: str, chat_id: str) -> str:
        """`<platform>:<12 hex>`; empty and already redacted ids are kept."""
        if not chat_id or is_redacted_chat(platform, chat_id):
            return chat_id
        return f"{platform}:{self.digest(chat_id)}"

    def thread(self, thread_id: str) -> str:
        """`thread_<12 hex>`; empty and already redacted ids are kept."""
        if not thread_id or is_redacted_thread(thread_id):
            return thread_id
        return f"thread_{self.digest(thread_id)}"

    def message_ref(self, ref: str) -> str:
        """`ref_<24 hex>`; empty and already redacted refs are kept."""
        if not ref_is_raw(ref):
            return ref
        return f"ref_{self.digest(ref, _REF_DIGEST_CHARS)}"

    def fingerprint_key(self) -> bytes | None:
        """A key of its own for request fingerprints (derived, so that a fingerprint
        never equals an id's digest): they cover requests that carry raw ids."""
        if self.key is None:
            return None
        return hmac.new(self.key, b"switchboard request fingerprint", hashlib.sha256).digest()


def is_redacted_user(value: str) -> bool:
    return _REDACTED_USER.fullmatch(value) is not None


def is_redacted_thread(value: str) -> bool:
    return _REDACTED_THREAD.fullmatch(value) is not None


def sender_is_raw(sender: str) -> bool:
    """Whether a message sender would change when redacted (so is worth reading the
    agent's settings for): not empty, not redacted already, not an agent."""
    return bool(sender) and not is_redacted_user(sender) and not _AGENT_SENDER.fullmatch(sender)


def ref_is_raw(ref: str) -> bool:
    """Whether a message ref would change when redacted: not empty, not redacted already."""
    return bool(ref) and _REDACTED_REF.fullmatch(ref) is None


def is_redacted_chat(platform: str, value: str) -> bool:
    prefix, separator, digest = value.rpartition(":")
    return bool(separator) and prefix == platform and _DIGEST.fullmatch(digest) is not None


def read_key(key_file: Path | None, key_value: str | None) -> bytes | None:
    """The key from a file (its trailing newline ignored) or given itself; None for none.

    Raises `PiiKeyRefused` for both at once, an unreadable file, a short key, or one
    that is no secret (a placeholder such as the manifest's, a repeated pattern)."""
    if key_file is not None and key_value is not None:
        raise PiiKeyRefused(
            "give the PII key one way: --pii-key-file (SWITCHBOARD_PII_KEY_FILE) or "
            "SWITCHBOARD_PII_KEY, not both"
        )
    if key_file is not None:
        try:
            key = key_file.read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise PiiKeyRefused(f"cannot read the PII key file {key_file}: {exc}") from exc
    elif key_value is not None:
        key = key_value.encode("utf-8")
    else:
        return None
    Redactor(key)  # refuses a short key here, with its message
    # latin-1 maps each byte to one character: a key of random bytes is judged too.
    problem = secret_checks.weakness(key.decode("latin-1"), min_chars=MIN_KEY_BYTES)
    if problem is not None:
        raise PiiKeyRefused(f"the PII key is not a secret: {problem}; {secret_checks.MAKE_ONE}")
    return key
