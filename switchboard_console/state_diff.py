"""A session's state at a sequence against its state now, part by part: the inbox
and outbox (messages by the sequence that queued them), the task, the temp state
and the agent's memory (entries by key)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from switchboard.session.v1 import session_service_pb2 as pb


@dataclass(frozen=True)
class Change:
    """One entry of a part: its value then and now ("" where it was absent)."""

    key: str
    then: str
    now: str

    @property
    def status(self) -> str:
        if self.then == self.now:
            return "same"
        if not self.then:
            return "added"
        if not self.now:
            return "removed"
        return "changed"


@dataclass(frozen=True)
class Part:
    name: str
    changes: list[Change]

    @property
    def changed(self) -> int:
        return sum(1 for change in self.changes if change.status != "same")


def _entries(then: Mapping[str, str], now: Mapping[str, str]) -> list[Change]:
    return [Change(key, then.get(key, ""), now.get(key, "")) for key in sorted({*then, *now})]


def _queued(items: Sequence[pb.QueuedMessage]) -> dict[str, str]:
    return {f"#{item.sequence}": item.message.content for item in items}


def _task(task: pb.Task) -> dict[str, str]:
    return {task.task_id: task.description} if task.task_id or task.description else {}


def compare(then: pb.GetSessionStateResponse, now: pb.GetSessionStateResponse) -> list[Part]:
    """Every part, each with its entries then and now (unchanged ones included)."""
    return [
        Part("inbox", _entries(_queued(then.state.inbox), _queued(now.state.inbox))),
        Part("outbox", _entries(_queued(then.state.outbox), _queued(now.state.outbox))),
        Part("task", _entries(_task(then.state.current_task), _task(now.state.current_task))),
        Part("temp state", _entries(then.state.temp_state, now.state.temp_state)),
        Part("agent memory", _entries(then.agent.memory, now.agent.memory)),
    ]


def current(state: pb.GetSessionStateResponse) -> list[Part]:
    """The parts of one state, for showing it alone."""
    return compare(state, state)
