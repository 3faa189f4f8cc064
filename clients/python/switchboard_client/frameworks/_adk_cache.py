"""Decoded ADK events of recently used sessions, for `frameworks.adk`: a session read
again at the version it was last read or written at has the same history (a session's
versions never repeat: they rise with each of its changes and jump past every earlier
one on a rewind or checkout), so its events need neither a history read nor decoding,
which is most of a 1,000-event `get_session`. Events are shared between the sessions
handed out, as ADK's in-memory service shares them with its light copies."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from google.adk.events import Event

#: Sessions kept (least recently used dropped first).
SESSIONS = 256


@dataclass
class _Entry:
    version: int
    events: list[Event]


class EventCache:
    """(agent, stored session id) -> every event of the session at one version."""

    def __init__(self, sessions: int = SESSIONS) -> None:
        self._sessions = sessions
        self._entries: OrderedDict[tuple[str, str], _Entry] = OrderedDict()

    def events(self, key: tuple[str, str], version: int) -> list[Event] | None:
        """A copy of the session's event list at `version`, or None if not known."""
        entry = self._entries.get(key)
        if entry is None or entry.version != version:
            return None
        self._entries.move_to_end(key)
        return list(entry.events)

    def keep(self, key: tuple[str, str], version: int, events: list[Event]) -> None:
        if self._sessions <= 0:
            return
        self._entries[key] = _Entry(version, list(events))
        self._entries.move_to_end(key)
        while len(self._entries) > self._sessions:
            self._entries.popitem(last=False)

    def appended(self, key: tuple[str, str], before: int, after: int, event: Event) -> None:
        """`event` was appended, moving the session from version `before` to `after`;
        known only if the entry was at `before` (else another writer came between)."""
        entry = self._entries.get(key)
        if entry is None or entry.version != before:
            self._entries.pop(key, None)
            return
        entry.events.append(event)
        entry.version = after

    def drop(self, key: tuple[str, str]) -> None:
        self._entries.pop(key, None)
