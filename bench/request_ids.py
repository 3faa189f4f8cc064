"""Whether the load generators send request ids (AIP-155) with their writes.

Set SWITCHBOARD_BENCH_REQUEST_IDS=1 to measure the cost of exactly-once
retries: every write then carries a fresh UUID, so the server also records the
request and its answer in the write's transaction. Unset: no ids (as before).
"""

from __future__ import annotations

import os
import uuid

ENABLED = os.environ.get("SWITCHBOARD_BENCH_REQUEST_IDS", "") == "1"


def request_id() -> str:
    """A fresh id, or "" (no id) when request ids are off."""
    return str(uuid.uuid4()) if ENABLED else ""
