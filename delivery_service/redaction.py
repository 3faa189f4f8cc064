"""Personal ids kept out of the ledger: what a server with a PII key stores.

A gateway of an agent that redacts PII records the reply target sealed
(`sealed_target`, opened only by gateways), never a raw chat or thread id. The
session key is the one part left that may carry raw ids (a key built by a
gateway, or by an agent that does not redact), and the ledger cannot tell one
key from another: so with a key, every session key is stored as a keyed digest,
`agent:<name>:sk_<32 hex>` (the agent kept, for row scoping), or `sk_<32 hex>`
for a key naming no agent. A key already in that form is kept, so that a key
read back from a row finds the row again. The digest is deterministic: the same
key always gives the same stored key, hence the same obligation id, and lookups
by the key as the gateway knows it work unchanged. Message refs and the platform's
message ids are stored as `ref_<32 hex>` and `pm_<32 hex>` for the same reason
(Telegram's and Slack's name their chat: `<chat id>:<message id>`).

Without a key the ledger stores what it is given, as before.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

from delivery_service.records import agent_of
from session_service.pii import Redactor

#: 128 bits: distinct keys never share a stored key, so replies never share a row.
_DIGEST_CHARS = 32
STORED_SESSION_KEY = re.compile(
    rf"(agent:[a-z0-9][a-z0-9_-]{{0,62}}:)?sk_[0-9a-f]{{{_DIGEST_CHARS}}}"
)
_STORED_REF = re.compile(rf"(ref|pm)_[0-9a-f]{{{_DIGEST_CHARS}}}")


@dataclass(frozen=True)
class LedgerRedactor:
    """Hashes session keys with the server's PII key (None: stores them as given)."""

    key: bytes | None = field(default=None, repr=False)  # never in a log line or traceback

    def __post_init__(self) -> None:
        Redactor(self.key)  # refuses a key too short, with the SessionService's message

    @property
    def keyed(self) -> bool:
        return self.key is not None

    def session_key(self, given: str) -> str:
        """The key as stored: a keyed digest, unless it is one already (or no key)."""
        if self.key is None or STORED_SESSION_KEY.fullmatch(given):
            return given
        agent = agent_of(given)
        prefix = f"agent:{agent}:" if agent else ""
        return f"{prefix}sk_{self._digest(given)}"

    def message_ref(self, given: str) -> str:
        """`ref_<32 hex>` (empty and stored refs kept, and any ref without a key)."""
        return self._id("ref", given)

    def platform_message_id(self, given: str) -> str:
        """`pm_<32 hex>` (empty and stored ids kept, and any id without a key)."""
        return self._id("pm", given)

    def _id(self, prefix: str, given: str) -> str:
        if self.key is None or not given or _STORED_REF.fullmatch(given):
            return given
        return f"{prefix}_{self._digest(given)}"

    def _digest(self, value: str) -> str:
        assert self.key is not None
        # A key of its own, so that a stored value never equals a SessionService digest.
        derived = hmac.new(self.key, b"switchboard ledger session key", hashlib.sha256).digest()
        return hmac.new(derived, value.encode("utf-8"), hashlib.sha256).hexdigest()[:_DIGEST_CHARS]

    def fingerprint_key(self) -> bytes | None:
        """Keys the request records' fingerprints: requests carry raw session keys."""
        return Redactor(self.key).fingerprint_key()
