"""The console's logins, its live tail, and its actions: a rewind or checkout seen
before it is made, and the delivery actions on a selection or on all matching rows,
each confirmed first. Every action done is recorded in the log with the operator's
principal (RecordOperatorAction)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
from sse_starlette.sse import EventSourceResponse
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from switchboard_client.errors import SwitchboardError

from switchboard.delivery.v1 import delivery_service_pb2 as dpb
from switchboard.session.v1 import session_service_pb2 as pb
from switchboard_console.clients import SessionCalls
from switchboard_console.logins import COOKIE
from switchboard_console.pages import delivery_filters, filter_fields
from switchboard_console.security import same_origin
from switchboard_console.web import (
    PageError,
    checked_form,
    console_of,
    deliveries,
    login_of,
    page_error_of,
    render,
    sequence_param,
    sessions,
    text_field,
)

# -- logging in ---------------------------------------------------------------------------


async def login_form(request: Request) -> Response:
    return render(request, "login.html")


async def _is_admin(calls: SessionCalls) -> bool:
    """Whether a token may call admin-only methods; raises for a token the services
    refuse altogether."""
    try:
        await calls.list_checkpoints(page_size=1)
    except SwitchboardError as error:
        if error.code == grpc.StatusCode.PERMISSION_DENIED:
            return False
        raise
    return True


async def login(request: Request) -> Response:
    if not same_origin(request.headers, request.url.scheme):
        raise PageError(403, "Refused", "this login did not come from the console's login page")
    form = await request.form()
    token = form.get("token", "")
    if not isinstance(token, str) or len(token) > 4096:
        raise PageError(400, "Bad input", "a token is text of at most 4096 characters")
    console = console_of(request)
    try:
        admin = await _is_admin(console.channels.sessions(token.strip()))
    except SwitchboardError as error:
        refused = page_error_of(error)
        return render(request, "login.html", status=refused.status, error=refused.message)
    login_id, _ = console.logins.add(token.strip(), admin)
    response = RedirectResponse("/" if admin else "/sessions", status_code=303)
    response.set_cookie(
        COOKIE,
        login_id,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


async def logout(request: Request) -> Response:
    await checked_form_for_logout(request)
    console_of(request).logins.remove(request.cookies.get(COOKIE))
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


async def checked_form_for_logout(request: Request) -> None:
    """Logging out changes nothing in the services: allowed in read-only mode, but
    still from a console page with the login's CSRF token."""
    if not same_origin(request.headers, request.url.scheme):
        raise PageError(403, "Refused", "this request did not come from a console page (origin)")
    login = login_of(request)
    form = await request.form()
    presented = form.get("csrf")
    if not isinstance(presented, str) or not login.csrf_matches(presented):
        raise PageError(403, "Refused", "this form's CSRF token is missing or stale")


# -- the live tail ------------------------------------------------------------------------


async def live(request: Request) -> Response:
    login = login_of(request)
    if not login.admin:
        raise PageError(403, "Not allowed with this token", "the live tail needs an admin token")
    hub = console_of(request).hub
    assert hub is not None
    after = sequence_param(
        request.headers.get("last-event-id") or request.query_params.get("after"), "after"
    )
    follower = hub.follow(login.token, after or 0)

    async def stream() -> AsyncIterator[dict[str, Any]]:
        try:
            while True:
                summary = await follower.queue.get()
                if summary is None:
                    yield {"event": "reload", "data": "{}"}
                    return
                yield {"id": str(summary["seq"]), "event": "append", "data": json.dumps(summary)}
        finally:
            hub.leave(follower)

    return EventSourceResponse(stream(), ping=15)


# -- rewind and checkout ------------------------------------------------------------------


def _target(values: Any) -> tuple[str, int | None, str]:
    """(mode, sequence, checkpoint) of a rewind or checkout page or form."""
    mode = str(values.get("mode") or "rewind")
    if mode not in ("rewind", "checkout"):
        raise PageError(400, "Bad input", "mode must be rewind or checkout")
    sequence = sequence_param(values.get("sequence"), "sequence")
    checkpoint = str(values.get("checkpoint") or "").strip()
    if mode == "checkout" and checkpoint:
        raise PageError(400, "Bad input", "a checkout goes to a sequence, not a checkpoint")
    if (sequence is None) == (not checkpoint):
        raise PageError(400, "Bad input", "give either a sequence or a checkpoint label")
    return mode, sequence, checkpoint


async def _move(
    calls: SessionCalls, mode: str, sequence: int | None, checkpoint: str, preview: bool
) -> pb.RewindResponse | pb.CheckoutResponse:
    if mode == "checkout":
        assert sequence is not None
        return await calls.checkout(pb.CheckoutRequest(sequence=sequence, preview=preview))
    request = pb.RewindRequest(preview=preview)
    if checkpoint:
        request.checkpoint = checkpoint
    else:
        assert sequence is not None
        request.sequence = sequence
    return await calls.rewind(request)


async def rewind_page(request: Request) -> Response:
    calls = sessions(request)
    checkpoints = await calls.list_checkpoints(page_size=100)
    if not request.query_params.get("sequence") and not request.query_params.get("checkpoint"):
        return render(request, "rewind.html", preview=None, checkpoints=checkpoints)
    mode, sequence, checkpoint = _target(request.query_params)
    preview = await _move(calls, mode, sequence, checkpoint, preview=True)
    return render(
        request,
        "rewind.html",
        preview=preview,
        mode=mode,
        sequence=sequence,
        checkpoint=checkpoint,
        typed_target=checkpoint or str(sequence),
        checkpoints=checkpoints,
    )


async def rewind_apply(request: Request) -> Response:
    _, form = await checked_form(request)
    mode, sequence, checkpoint = _target(form)
    expected = checkpoint or str(sequence)
    typed = text_field(form, "confirm", limit=200)
    if typed != expected:
        raise PageError(
            400,
            "Not confirmed",
            f"type the target exactly ({expected!r}) to confirm; you typed {typed[:60]!r}. "
            "Nothing was changed.",
        )
    calls = sessions(request)
    moved = await _move(calls, mode, sequence, checkpoint, preview=False)
    summary = moved.summary
    detail = (
        "unchanged: nothing to move"
        if moved.unchanged
        else f"record {moved.record.sequence}; {summary.abandoned_count} events abandoned, "
        f"{summary.restored_count} restored, in {summary.changed_count} agents/sessions"
    )
    audit, audit_note = await _audited(
        calls,
        f"session.{mode}",
        f"to {checkpoint or sequence} (state of {moved.to_sequence})",
        detail,
    )
    return render(request, "moved.html", moved=moved, mode=mode, audit=audit, audit_note=audit_note)


async def _audited(
    calls: SessionCalls, action: str, subject: str, detail: str
) -> tuple[pb.Event | None, str]:
    """Records a done action; a failure to record it is said on the result page."""
    try:
        return await calls.record_action(action, subject, detail), ""
    except SwitchboardError as error:
        return None, f"the action was done, but recording it failed: {page_error_of(error).message}"


# -- delivery actions ---------------------------------------------------------------------

DELIVERY_ACTIONS = {"retry": "Retry", "abandon": "Abandon", "hand_over": "Hand over"}
#: The states each action can move (what "all matching" counts and touches).
ELIGIBLE = {
    "retry": (dpb.OBLIGATION_STATE_FAILED, dpb.OBLIGATION_STATE_ABANDONED),
    "abandon": (
        dpb.OBLIGATION_STATE_PENDING,
        dpb.OBLIGATION_STATE_ATTEMPTING,
        dpb.OBLIGATION_STATE_FAILED,
    ),
    "hand_over": (
        dpb.OBLIGATION_STATE_PENDING,
        dpb.OBLIGATION_STATE_ATTEMPTING,
        dpb.OBLIGATION_STATE_FAILED,
    ),
}
MAX_SELECTED = 1000


def _delivery_request(form: Any) -> dict[str, Any]:
    action = str(form.get("action") or "")
    if action not in DELIVERY_ACTIONS:
        raise PageError(400, "Bad input", "action must be retry, abandon or hand_over")
    scope = str(form.get("scope") or "")
    if scope not in ("selected", "all"):
        raise PageError(400, "Bad input", "scope must be selected or all")
    ids = [str(value) for value in form.getlist("id")]
    if scope == "selected" and not ids:
        raise PageError(400, "Nothing selected", "tick the rows to act on, or act on all matching")
    if len(ids) > MAX_SELECTED:
        raise PageError(400, "Bad input", f"select at most {MAX_SELECTED} rows")
    filters = delivery_filters(form)
    to_gateway = text_field(form, "to_gateway", 128)
    if action == "hand_over" and not to_gateway:
        raise PageError(400, "Bad input", "name the gateway (bot) to hand the rows over to")
    if action == "hand_over" and not filters["gateway"]:
        raise PageError(
            400, "Bad input", "filter by a gateway (bot) first: rows are handed over from one"
        )
    return {
        "action": action,
        "scope": scope,
        "ids": ids if scope == "selected" else [],
        "filters": filters,
        "to_gateway": to_gateway,
        "reason": text_field(form, "reason", 1024),
    }


def _eligible_states(action: str, filters: dict[str, str]) -> list[dict[str, Any]]:
    """The filters' fields once per state the action can move, within the filters."""
    fields = filter_fields(filters)
    states = ELIGIBLE[action]
    if fields["state"]:
        chosen = [fields["state"]] if fields["state"] in states else []
    else:
        chosen = list(states)
    return [{**fields, "state": state, "owed_only": False} for state in chosen]


async def _count_all(request: Request, action: str, filters: dict[str, str]) -> int:
    calls = deliveries(request)
    counts = await asyncio.gather(
        *(calls.count(dpb.CountObligationsRequest(**f)) for f in _eligible_states(action, filters))
    )
    return sum(count.count for count in counts)


async def deliveries_confirm(request: Request) -> Response:
    _, form = await checked_form(request)
    asked = _delivery_request(form)
    if asked["scope"] == "all":
        touched = await _count_all(request, asked["action"], asked["filters"])
    else:
        touched = len(set(asked["ids"]))
    return render(
        request,
        "confirm.html",
        asked=asked,
        touched=touched,
        title=DELIVERY_ACTIONS[asked["action"]],
    )


async def _matching_ids(request: Request, action: str, filters: dict[str, str]) -> list[str]:
    calls = deliveries(request)
    ids: list[str] = []
    for fields in _eligible_states(action, filters):
        listing = dpb.ListObligationsRequest(**fields, page_size=1000)
        while True:
            page = await calls.list_page(listing)
            ids += [row.id for row in page.obligations]
            if not page.next_page_token:
                break
            listing.page_token = page.next_page_token
    return ids


async def deliveries_apply(request: Request) -> Response:
    _, form = await checked_form(request)
    asked = _delivery_request(form)
    ids = asked["ids"] or await _matching_ids(request, asked["action"], asked["filters"])
    done, refused = await _act(request, asked, sorted(set(ids)))
    subject = f"{len(ids)} obligations ({asked['scope']})"
    detail = f"{done} done, {len(refused)} refused"
    if asked["action"] == "hand_over":
        detail += f"; to gateway {asked['to_gateway']}"
    audit, audit_note = await _audited(
        sessions(request), f"delivery.{asked['action']}", subject, detail
    )
    return render(
        request,
        "acted.html",
        asked=asked,
        title=DELIVERY_ACTIONS[asked["action"]],
        done=done,
        refused=refused,
        audit=audit,
        audit_note=audit_note,
    )


async def _act(
    request: Request, asked: dict[str, Any], ids: list[str]
) -> tuple[int, list[tuple[str, str]]]:
    """Does the action on each row; (rows done, (row, why) for each refused)."""
    calls = deliveries(request)
    if asked["action"] == "hand_over":
        done = 0
        for start in range(0, len(ids), MAX_SELECTED):
            done += await calls.hand_over(
                asked["filters"]["gateway"], asked["to_gateway"], ids[start : start + MAX_SELECTED]
            )
        return done, []
    done, refused = 0, []
    for obligation_id in ids:
        try:
            if asked["action"] == "retry":
                await calls.retry(obligation_id)
            else:
                await calls.abandon(obligation_id, asked["reason"] or "operator console")
            done += 1
        except SwitchboardError as error:
            if error.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.PERMISSION_DENIED):
                raise
            refused.append((obligation_id, page_error_of(error).message))
    return done, refused
