"""Reply targets sealed by the gateways: where a reply goes, kept without a raw id.

An agent that redacts PII has its chat, thread and user ids hashed by the
SessionService, so a gateway resuming a turn after a crash cannot answer the
chat from the stored session. The gateway that starts a turn therefore seals
the raw target (platform, chat id, thread id) with a key only gateways hold, and
hands the services the sealed bytes: on the resume mark
(`MarkResumableRequest.reply_target`) and in the ledger row
(`RecordObligationRequest.sealed_target`). A gateway resuming the turn or
redelivering the row opens them; neither service can.

The envelope (version 1), the same in the Node gateway (clients/node/src/reply-targets.js):

    byte 0       1 (the envelope version)
    bytes 1-12   a random nonce
    bytes 13-    AES-256-GCM ciphertext of the target, then its 16-byte tag,
                 with the associated data b"switchboard reply target v1"

The plaintext is the JSON object {"platform", "chat_id", "thread_id"}, padded
with spaces to a multiple of 128 bytes, so that the length of a sealed target
says little about the ids in it. A random 96-bit nonce stays safe for about
2^32 seals per key: rotate the key long before that.

The key: 32 random bytes, given as 64 hex characters or base64 (`openssl rand
-hex 32`), from the gateway's `reply_key` option or SWITCHBOARD_REPLY_KEY. A key
of another length, or one that is plainly not random (a placeholder, a repeated
pattern), is refused when the gateway is built. Every gateway that may resume
or redeliver another's turns needs the same key.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

#: The environment variable a gateway reads its reply key from.
REPLY_KEY_ENV = "SWITCHBOARD_REPLY_KEY"
KEY_BYTES = 32
VERSION = 1
NONCE_BYTES = 12
TAG_BYTES = 16
#: What the services accept (`switchboard.validation.sealed_target`).
MAX_SEALED_BYTES = 1024
_ASSOCIATED_DATA = b"switchboard reply target v1"
_PADDING = 128
_MAX_PLAINTEXT = MAX_SEALED_BYTES - 1 - NONCE_BYTES - TAG_BYTES
#: A key whose bytes take fewer values than this is not random (32 random bytes take
#: about 31; fewer than 16 happens by chance with a probability far below 1e-20). A
#: placeholder that decodes to 32 bytes ("00...0", a word repeated) fails this test;
#: one that does not ("CHANGE-ME") fails the decoding.
_MIN_DISTINCT_BYTES = 16


class ReplyKeyRefused(ValueError):
    """The reply key cannot be used; the message says what to give instead."""


class TargetUnreadable(Exception):
    """A sealed target this gateway cannot open: sealed with another key, tampered
    with, or not a sealed target at all. The message names no id."""


@dataclass(frozen=True)
class ReplyTarget:
    """Where a reply goes on its platform."""

    platform: str
    chat_id: str
    thread_id: str = ""


def _decoded_key(text: str) -> bytes:
    """32 bytes from 64 hex characters or base64 (standard or URL-safe)."""
    if re.fullmatch(r"[0-9a-fA-F]{64}", text):
        return bytes.fromhex(text)
    standard = text.replace("-", "+").replace("_", "/")
    try:
        key = base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ReplyKeyRefused(
            f"the reply key must be {KEY_BYTES} random bytes, given as 64 hex characters "
            f"or base64 (e.g. `openssl rand -hex 32`); this one is {len(text)} characters "
            "that are neither (a placeholder, or a key too short)"
        )
    return key


def parse_key(value: str | bytes) -> bytes:
    """The 32-byte key from its text (hex or base64) or its raw bytes; refuses a short,
    placeholder or plainly non-random key with `ReplyKeyRefused`."""
    if isinstance(value, bytes) and len(value) == KEY_BYTES:
        key = value
    else:
        text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
        key = _decoded_key(text.strip())
    if len(set(key)) < _MIN_DISTINCT_BYTES:
        raise ReplyKeyRefused(
            "the reply key is not random (a placeholder, or a few byte values repeated): "
            "give 32 random bytes, e.g. `openssl rand -hex 32`"
        )
    return key


class ReplySealer:
    """Seals and opens reply targets with one gateway key."""

    def __init__(self, key: str | bytes) -> None:
        self._aead = AESGCM(parse_key(key))

    def seal(self, target: ReplyTarget) -> bytes:
        """The envelope of `target`. ValueError when its ids are too long to fit 1 KiB."""
        plain = json.dumps(
            {"platform": target.platform, "chat_id": target.chat_id, "thread_id": target.thread_id},
            ensure_ascii=False,
            separators=(",", ":"),
        ).encode("utf-8")
        if len(plain) > _MAX_PLAINTEXT:
            raise ValueError(
                f"the reply target takes {len(plain)} bytes; at most {_MAX_PLAINTEXT} can be "
                "sealed (the services keep at most 1 KiB)"
            )
        padded = plain.ljust(min(-(-len(plain) // _PADDING) * _PADDING, _MAX_PLAINTEXT))
        nonce = os.urandom(NONCE_BYTES)
        return bytes([VERSION]) + nonce + self._aead.encrypt(nonce, padded, _ASSOCIATED_DATA)

    def open(self, sealed: bytes) -> ReplyTarget:
        """The target sealed in `sealed`; `TargetUnreadable` when this key cannot open it."""
        if len(sealed) < 1 + NONCE_BYTES + TAG_BYTES + 1 or sealed[0] != VERSION:
            raise TargetUnreadable("not a sealed reply target of envelope version 1")
        nonce, body = sealed[1 : 1 + NONCE_BYTES], sealed[1 + NONCE_BYTES :]
        try:
            plain = self._aead.decrypt(nonce, body, _ASSOCIATED_DATA)
        except InvalidTag:
            raise TargetUnreadable(
                "the sealed reply target does not open with this gateway's reply key "
                "(sealed with another key, or altered)"
            ) from None
        try:
            fields = json.loads(plain.decode("utf-8"))
            parts = [fields["platform"], fields["chat_id"], fields["thread_id"]]
        except (UnicodeDecodeError, ValueError, KeyError, TypeError):
            parts = []
        if not all(isinstance(part, str) for part in parts) or not all(parts[:2]):
            raise TargetUnreadable("the sealed reply target opened to no platform and chat")
        return ReplyTarget(*parts)


def reply_sealer(
    key: str | bytes | None, environ: Mapping[str, str] = os.environ
) -> ReplySealer | None:
    """A gateway's sealer: from its `reply_key` option, else SWITCHBOARD_REPLY_KEY;
    None when neither is set (the gateway then records reply targets in clear)."""
    if key is None:
        key = environ.get(REPLY_KEY_ENV) or None
    return None if key is None else ReplySealer(key)
