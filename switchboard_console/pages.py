"""The console's read pages: timeline, sessions, session, deliveries, audit."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from starlette.requests import Request
from starlette.responses import Response
from switchboard_client.errors import SwitchboardError

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_console import state_diff, timeline
from switchboard_console.view_models import (
    STATES_BY_NAME,
    event_summary,
    obligation_row,
    when,
)
from switchboard_console.web import (
    PageError,
    deliveries,
    page_error_of,
    render,
    sequence_param,
    sessions,
)

PAGE_ROWS = 100
_SESSION_STATUSES = {"open": pb.SESSION_STATUS_OPEN, "ended": pb.SESSION_STATUS_ENDED}


async def _or_refusal(call: Any) -> tuple[Any, str]:
    """A call whose refusal (e.g. an admin-only read with an agent token) is shown
    in its section instead of failing the page."""
    try:
        return await call, ""
    except SwitchboardError as error:
        if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            raise
        return None, page_error_of(error).message


# -- timeline -----------------------------------------------------------------------------


async def timeline_page(request: Request) -> Response:
    query = request.query_params
    before = sequence_param(query.get("before"), "before")
    after = sequence_param(query.get("after"), "after")
    expanded = frozenset(query.getlist("expand"))
    request_ = pb.ListLogEventsRequest(page_size=timeline.WINDOW_EVENTS)
    if after is not None:
        request_.after_sequence = after
    else:
        request_.newest = True
        if before is not None:
            request_.before_sequence = before
    calls = sessions(request)
    page = await calls.list_log(request_)
    summaries = [event_summary(e.event, abandoned=e.abandoned) for e in page.entries]
    following = after is None and before is None
    first = summaries[0]["seq"] if summaries else page.head_sequence
    checkpoints = await calls.list_checkpoints(min_sequence=max(1, first))
    picture = timeline.lay_out(
        summaries,
        [(c.label, c.sequence) for c in checkpoints],
        head=page.head_sequence,
        following=following,
        expanded=expanded,
    )
    last = summaries[-1]["seq"] if summaries else 0
    return render(
        request,
        "timeline.html",
        picture=picture,
        summaries=summaries,
        markers=[s for s in summaries if s["kind"] in ("rewound", "operator_action")],
        checkpoints=[c for c in checkpoints if c.sequence <= picture.high],
        head=page.head_sequence,
        retained_from=page.retained_from,
        following=following,
        older=first if first > max(1, page.retained_from) else None,
        newer=last if not following and last < page.head_sequence else None,
        expanded=sorted(expanded),
        window=timeline.WINDOW_EVENTS,
    )


# -- sessions -----------------------------------------------------------------------------


def _session_filters(request: Request) -> dict[str, str]:
    query = request.query_params
    filters = {
        name: (query.get(name) or "").strip()
        for name in ("agent", "state", "transport", "routing_key")
    }
    if filters["state"] and filters["state"] not in _SESSION_STATUSES:
        raise PageError(400, "Bad input", "state must be open, ended or empty (any)")
    return filters


def _session_row(session: pb.Session, owed: int | None) -> dict[str, Any]:
    flags = [
        name
        for name, on in (
            ("suspended", session.suspended),
            ("resume pending", session.resume_pending),
        )
        if on
    ]
    return {
        "id": session.session_id,
        "agent": session.agent,
        "state": "open" if session.status == pb.SESSION_STATUS_OPEN else "ended",
        "flags": ", ".join(flags),
        "transport": session.source.transport,
        "routing_key": session.routing_key,
        "version": session.version,
        "messages": session.message_count,
        "last_activity": when(session.update_time),
        "owed": owed,
    }


async def sessions_page(request: Request) -> Response:
    filters = _session_filters(request)
    page_token = request.query_params.get("page", "")
    listed = await sessions(request).list_sessions(
        pb.ListSessionsRequest(
            agent=filters["agent"],
            status=_SESSION_STATUSES.get(filters["state"], pb.SESSION_STATUS_UNSPECIFIED),
            transport=filters["transport"],
            routing_key=filters["routing_key"],
            page_size=PAGE_ROWS,
            page_token=page_token,
        )
    )
    keys = [s.routing_key or s.session_id for s in listed.sessions]
    counted, owed_note = await _or_refusal(
        deliveries(request).count(dpb.CountObligationsRequest(owed_only=True, session_keys=keys))
    )
    owed = [c.count for c in counted.session_key_counts] if counted else [None] * len(keys)
    rows = [_session_row(s, n) for s, n in zip(listed.sessions, owed, strict=True)]
    return render(
        request,
        "sessions.html",
        rows=rows,
        filters=filters,
        next_page=listed.next_page_token,
        owed_note=owed_note,
    )


# -- one session --------------------------------------------------------------------------


def _rewind_of(sequence: int, rewinds: list[pb.LogEntry]) -> int:
    """The rewind record that abandoned `sequence`: the earliest counting record after
    it whose target lies before it (0: none found in what was read)."""
    for entry in rewinds:
        record = entry.event
        if not entry.abandoned and record.rewound.to_sequence < sequence < record.sequence:
            return record.sequence
    return 0


async def _history(request: Request, agent: str, session_id: str) -> dict[str, Any]:
    calls = sessions(request)
    page = await calls.history_page(
        pb.GetHistoryRequest(
            agent=agent, session_id=session_id, newest=True, include_abandoned=True, limit=100
        )
    )
    abandoned = [m.sequence for m in page.messages if m.abandoned]
    rewinds: list[pb.LogEntry] = []
    note = ""
    if abandoned:
        found, note = await _or_refusal(
            calls.list_log(
                pb.ListLogEventsRequest(
                    event_types=["rewound"], after_sequence=min(abandoned), page_size=1000
                )
            )
        )
        rewinds = list(found.entries) if found else []
    messages = [
        {
            "seq": m.sequence,
            "role": pb.Role.Name(m.message.role).removeprefix("ROLE_").lower(),
            "content": m.message.content,
            "sender": m.message.sender,
            "abandoned": m.abandoned,
            "rewind": _rewind_of(m.sequence, rewinds) if m.abandoned else 0,
        }
        for m in page.messages
    ]
    return {"messages": messages, "rewind_note": note, "older": page.next_page_token != ""}


async def session_page(request: Request) -> Response:
    agent = request.path_params["agent"]
    session_id = request.path_params["session_id"]
    at = sequence_param(request.query_params.get("at"), "at")
    calls = sessions(request)
    now = await calls.state(agent, session_id)
    session = now.state.session
    parts = state_diff.current(now)
    if at is not None:
        then = await calls.state_at(agent, session_id, at)
        parts = state_diff.compare(then, now)
    decisions, decisions_note = await _or_refusal(
        calls.list_log(
            pb.ListLogEventsRequest(
                session_id=session_id,
                event_types=["permission_checked"],
                newest=True,
                page_size=50,
            )
        )
    )
    rows, deliveries_note = await _or_refusal(
        deliveries(request).list_page(
            dpb.ListObligationsRequest(session_key=session.routing_key or session_id, page_size=100)
        )
    )
    owed = [
        obligation_row(row)
        for row in (rows.obligations if rows else [])
        if row.metadata.get("session_id", session_id) == session_id
    ]
    return render(
        request,
        "session.html",
        session=_session_row(session, None),
        lineage=session.lineage,
        history=await _history(request, agent, session_id),
        at=at,
        parts=parts,
        decisions=[event_summary(e.event, abandoned=e.abandoned) for e in decisions.entries]
        if decisions
        else [],
        decisions_note=decisions_note,
        obligations=owed,
        deliveries_note=deliveries_note,
    )


# -- deliveries ---------------------------------------------------------------------------

DELIVERY_FILTERS = ("state", "platform", "gateway", "agent")


def delivery_filters(values: Any) -> dict[str, str]:
    filters = {name: str(values.get(name) or "").strip() for name in DELIVERY_FILTERS}
    if filters["state"] not in ("", "owed", *STATES_BY_NAME):
        raise PageError(
            400, "Bad input", f"state must be owed, {', '.join(STATES_BY_NAME)} or empty (any)"
        )
    return filters


def filter_fields(filters: dict[str, str]) -> dict[str, Any]:
    """The filters as the fields ListObligations and CountObligations share."""
    state = filters["state"]
    return {
        "state": STATES_BY_NAME.get(state, dpb.OBLIGATION_STATE_UNSPECIFIED),
        "owed_only": state == "owed",
        "platform": filters["platform"],
        "gateway_name": filters["gateway"],
        "agent": filters["agent"],
    }


async def deliveries_page(request: Request) -> Response:
    filters = delivery_filters(request.query_params)
    fields = filter_fields(filters)
    calls = deliveries(request)
    listed, count, (stats, stats_note), (instances, instances_note) = await asyncio.gather(
        calls.list_page(
            dpb.ListObligationsRequest(
                **fields, page_size=PAGE_ROWS, page_token=request.query_params.get("page", "")
            )
        ),
        calls.count(dpb.CountObligationsRequest(**fields)),
        _or_refusal(calls.stats()),
        _or_refusal(calls.instances()),
    )
    return render(
        request,
        "deliveries.html",
        filters=filters,
        rows=[obligation_row(row) for row in listed.obligations],
        matching=count.count,
        next_page=listed.next_page_token,
        stats=stats,
        stats_note=stats_note,
        state_names={s.state: s.count for s in stats.state_counts} if stats else {},
        instances=instances or [],
        instances_note=instances_note,
        when=when,
    )


# -- audit --------------------------------------------------------------------------------


async def audit_page(request: Request) -> Response:
    before = sequence_param(request.query_params.get("before"), "before")
    page = await sessions(request).list_log(
        pb.ListLogEventsRequest(
            event_types=["operator_action", "rewound"],
            newest=True,
            page_size=PAGE_ROWS,
            before_sequence=before or 0,
        )
    )
    entries = []
    for entry in reversed(page.entries):
        event = entry.event
        body = event.operator_action if event.HasField("operator_action") else event.rewound
        entries.append(
            {
                **event_summary(event, abandoned=entry.abandoned),
                "principal": body.principal,
            }
        )
    older = page.entries[0].event.sequence if page.next_page_token else None
    return render(request, "audit.html", entries=entries, older=older)
