"""The SessionService's storage assembled: one object holding each part, built once
per backend by the composition root (`session_service.composition`)."""

from __future__ import annotations

from typing import Any

from session_service.storage.event_log import EventLog
from session_service.storage.history import History
from session_service.storage.markers import Markers
from session_service.storage.projections import Projections
from session_service.storage.schema import Tables
from session_service.storage.snapshots import Snapshots
from session_service.storage.states import States
from switchboard.database import Backend


class SessionStore:
    """The parts of session storage on one backend, each a concern of its own:
    `log` (the recorder), `snapshots`, `states` (their fold), `projections`,
    `markers` (the timeline, checkpoints, retention) and `history` (paged reads)."""

    def __init__(self, backend: Backend) -> None:
        self.tables = Tables(backend)
        self.backend = backend
        self.database: Any = backend.database
        self.models = self.tables.models
        self.log = EventLog(self.tables)
        self.snapshots = Snapshots(self.tables)
        self.states = States(self.snapshots, self.log)
        self.projections = Projections(self.tables, self.log, self.states)
        self.markers = Markers(self.tables, self.log, self.projections)
        self.history = History(self.tables, self.log)

    def lock_log(self) -> None:
        """The runner's first statement in every write transaction (see `EventLog.lock_log`)."""
        self.log.lock_log()
