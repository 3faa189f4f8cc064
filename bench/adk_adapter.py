"""The section `adk`: Google ADK's session service on Switchboard
(`switchboard_client.frameworks.adk`) beside ADK's own `DatabaseSessionService`
(SQLAlchemy + aiosqlite) and `SqliteSessionService`, in one run, with the same events
(`bench.peers.adk`'s: one user event of the benchmark's 100-byte message each).

Two figures each: `append_event` at 1 client (one durable write per event), and the
p50 of `get_session` of a session of 1,000 events. The adapter's get_session is measured
twice: warm (the adapter that wrote the session reads it again: its decoded events are
reused while the session's version is unchanged, as for a runner's next turn in the
process that ran the last one) and cold (an adapter keeping no events,
`cached_sessions=0`: the history is read and every event decoded, as after another
process wrote). The adapter runs in this process
against a `switchboard serve session` process on each selected backend; the ADK services
run in processes of their own (`bench.peers.child`), on SQLite files with ADK's own
settings. The table gives the adapter's ratio to each: appends/s over theirs, and their
get_session p50 over ours (both: higher is better for the adapter). The issue's goals
(append >= 3x, get_session >= 10x ADK's database service) are judged on the line.
Under them, a no-op RPC on each adapter's server at 1 client (`bench.noop`): its rate
over the database service's appends, and the service's get_session p50 over its p50,
the best any networked store could reach on either.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import Any

from bench import noop, peers, servers
from bench.peers import adk as adk_peer
from bench.peers.common import PeerResult, timed_async, timed_reads
from bench.plan import Context, Section
from bench.servers import Backend

#: The issue's goals: the adapter's append rate over ADK's database service's, and that
#: service's get_session p50 over the adapter's.
APPEND_GOAL = 3.0
GET_SESSION_GOAL = 10.0
_ADK_PEERS = ("adk-database", "adk-sqlite")


async def _measure_adapter(
    address: str, seconds: float, warmup_s: float, repetitions: int
) -> tuple[Any, Any, Any]:
    from switchboard_client.frameworks.adk import SwitchboardSessionService

    service = SwitchboardSessionService(address)
    cold = SwitchboardSessionService(address, cached_sessions=0)
    try:
        session = await service.create_session(app_name=adk_peer.APP, user_id=adk_peer.USER)

        async def append(_worker: int, i: int) -> None:
            await service.append_event(session, adk_peer._event(i))

        appends = await timed_async("adapter append_event", append, 1, seconds, warmup_s)
        loaded = await service.create_session(app_name=adk_peer.APP, user_id=adk_peer.USER)
        for i in range(adk_peer.GET_SESSION_EVENTS):
            await service.append_event(loaded, adk_peer._event(i))

        async def load(reader: Any) -> None:
            got = await reader.get_session(
                app_name=adk_peer.APP, user_id=adk_peer.USER, session_id=loaded.id
            )
            if got is None or len(got.events) != adk_peer.GET_SESSION_EVENTS:
                raise RuntimeError(f"the adapter returned {got and len(got.events)} events")

        warmup = max(2, repetitions // 10)
        warm = await timed_reads("get_session", lambda: load(service), repetitions, warmup)
        cold_loads = await timed_reads("get_session", lambda: load(cold), repetitions, warmup)
        return appends, warm, cold_loads
    finally:
        await service.close()
        await cold.close()


def _adapter_results(backend: Backend, ctx: Context, repetitions: int) -> list[PeerResult]:
    label = f"Switchboard ADK adapter ({backend.label})"
    with servers.serving("session", backend) as server:
        appends, warm, cold = asyncio.run(
            _measure_adapter(server.address, ctx.scale.seconds, ctx.scale.warmup_s, repetitions)
        )
        checks = noop.health_checks(server.address, 1, ctx.scale.seconds, ctx.scale.warmup_s)
    at = f"@{adk_peer.GET_SESSION_EVENTS:,}"
    key = f"adk-adapter-{{}}-{backend.key}"
    return [
        PeerResult(key.format("append"), f"{label}.append_event", "rate", appends),
        PeerResult(key.format("get-warm"), f"{label}.get_session {at}, warm", "latency", warm),
        PeerResult(key.format("get-cold"), f"{label}.get_session {at}, cold", "latency", cold),
        PeerResult(
            key.format("noop"),
            f"{noop.NAME} on the adapter's server ({backend.label})",
            "rate",
            checks,
        ),
    ]


def _peer_results(ctx: Context, repetitions: int) -> list[PeerResult]:
    results: list[PeerResult] = []
    for peer in peers.PEERS:
        if peer.name not in _ADK_PEERS:
            continue
        reason = peers.missing_reason(peer, None)
        results += (
            peers.skipped(peer, reason)
            if reason
            else peers.run_child(peer, ctx.scale.seconds, ctx.scale.warmup_s, repetitions)
        )
    return results


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return None if not ours or not theirs else ours / theirs


def _value(results: dict[str, PeerResult], key: str) -> float | None:
    result = results.get(key)
    return None if result is None else result.value


def _goal(name: str, ratio: float | None, goal: float) -> str:
    if ratio is None:
        return f"{name} >= {goal:g}x ADK DatabaseSessionService: not measured"
    verdict = "MET" if ratio >= goal else "NOT MET"
    return f"{name} >= {goal:g}x ADK DatabaseSessionService: {ratio:.1f}x {verdict}"


def _render(ours: list[PeerResult], theirs: list[PeerResult]) -> tuple[str, dict[str, Any]]:
    by_key = {result.key: result for result in theirs}
    lines = [peers.render_table([*ours, *theirs]), ""]
    ratios: dict[str, Any] = {}
    for append, warm, cold, checks in zip(*(ours[i::4] for i in range(4)), strict=True):
        backend = append.key.removeprefix("adk-adapter-append-")
        for peer in _ADK_PEERS:
            theirs_load = _value(by_key, f"{peer}-get-session")
            found = {
                "append": _ratio(append.value, _value(by_key, f"{peer}-append")),
                "get_session_warm": _ratio(theirs_load, warm.value),
                "get_session_cold": _ratio(theirs_load, cold.value),
            }
            ratios[f"{backend}/{peer}"] = found
            shown = {k: "-" if r is None else f"{r:.1f}x" for k, r in found.items()}
            lines.append(
                f"adapter on {backend} vs {peer}: append_event {shown['append']}, "
                f"get_session @1,000 warm {shown['get_session_warm']}, "
                f"cold {shown['get_session_cold']} (higher is better for the adapter)"
            )
            if peer == "adk-database":
                lines.append("  " + _goal("append_event", found["append"], APPEND_GOAL))
                for which in ("warm", "cold"):
                    name = f"get_session @1,000 ({which})"
                    ratio = found[f"get_session_{which}"]
                    lines.append("  " + _goal(name, ratio, GET_SESSION_GOAL))
                lines.append("  " + _noop_line(backend, checks, by_key, peer))
                ratios[f"{backend}/{peer}"] |= _noop_ratios(checks, by_key, peer)
    return "\n".join(lines), ratios


def _noop_ratios(
    checks: PeerResult, theirs: dict[str, PeerResult], peer: str
) -> dict[str, float | None]:
    """The no-op's rate over the peer's append rate, and the peer's get_session p50 over
    the no-op's p50: the best ratios a networked store could show."""
    latency = None if checks.measurement is None else checks.measurement.p50_ms
    return {
        "noop_over_append": _ratio(checks.value, _value(theirs, f"{peer}-append")),
        "get_session_over_noop": _ratio(_value(theirs, f"{peer}-get-session"), latency),
    }


def _noop_line(backend: str, checks: PeerResult, theirs: dict[str, PeerResult], peer: str) -> str:
    found = _noop_ratios(checks, theirs, peer)
    shown = {k: "-" if r is None else f"{r:.1f}x" for k, r in found.items()}
    rate = "-" if checks.value is None else f"{checks.value:,.0f}/s"
    return (
        f"{noop.NAME}, 1 client, {backend} server: {rate} = {shown['noop_over_append']} "
        f"{peer} append_event; {peer} get_session @1,000 p50 over the no-op's p50: "
        f"{shown['get_session_over_noop']} (the best any networked store could reach)"
    )


def run(ctx: Context) -> Section:
    title = "Google ADK: the Switchboard adapter beside ADK's own session services"
    if importlib.util.find_spec("google.adk") is None:
        note = "adk: skipped (google-adk is not installed: pip install -e '.[dev]')"
        return Section("adk", title, note, {"results": []}, notes=[note])
    repetitions = ctx.scale.pick(50, 20, 5)
    ours: list[PeerResult] = []
    for backend in ctx.backends:
        ctx.say(f"[adk] the adapter on {backend.label}")
        ours += _adapter_results(backend, ctx, repetitions)
    ctx.say("[adk] ADK's DatabaseSessionService and SqliteSessionService")
    theirs = _peer_results(ctx, repetitions)
    for result in [*ours, *theirs]:
        ctx.say(f"[adk] {peers.describe(result)}")
    text, ratios = _render(ours, theirs)
    data = {"results": [r.to_json() for r in [*ours, *theirs]], "ratios": ratios}
    return Section("adk", title, text, data)
