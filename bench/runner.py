"""`python -m bench`: every section, the goal lines and the targets, in one run.

    python -m bench [--quick | --smoke] [--only SECTIONS] [--skip SECTIONS] \
        [--backends sqlite-full,sqlite-normal,postgres] [--against REV] [--output FILE]

Sections run in the order of `SECTIONS`, each on the selected backends that apply to
it (Postgres only when it answers; otherwise its figures say why they are missing).
Tables go to stdout, progress to stderr; the JSON report (the machine, its load
average at start and end, every section's figures, the verdicts, notes) to
`bench/results/latest.json` and the plots beside it. A section that fails is a note,
the others still run, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import (
    adk_adapter,
    against,
    claim,
    console,
    db_latency,
    feature_costs,
    langgraph_checkpoints,
    open_loop,
    openai_agents_session,
    peers,
    reads,
    servers,
    throughput,
    timetravel,
    workers,
)
from bench.peers import goals
from bench.plan import SCALES, Context, Section
from bench.report import RESULTS_DIR, write_json, write_plots


def run_peers(ctx: Context) -> Section:
    """The in-process peers (`bench.peers`), each in a process of its own."""
    unreachable = None if ctx.backend("postgres") else ctx.postgres_reason or "not selected"
    results = peers.measure_all(
        ctx.scale.seconds,
        ctx.scale.warmup_s,
        ctx.scale.pick(50, 20, 5),
        unreachable,
        ctx.say,
    )
    title = "In-process peers (same run, one ~100-byte user message per durable write)"
    data = {"results": [result.to_json() for result in results]}
    return Section("peers", title, peers.render_table(results), data, goals.peer_sides(results))


SECTIONS: dict[str, Callable[[Context], Section]] = {
    "delivery": throughput.run_delivery,
    "claim": claim.run,
    "sessions": throughput.run_sessions,
    "open-loop": open_loop.run,
    "peers": run_peers,
    "timetravel": timetravel.run,
    "db-latency": db_latency.run,
    "feature-costs": feature_costs.run,
    "reads": reads.run,
    "console": console.run,
    "langgraph": langgraph_checkpoints.run,
    "adk": adk_adapter.run,
    "openai-agents": openai_agents_session.run,
    "workers": workers.run,
}
#: The goal-line figures each section gives.
SIDES = {**throughput.SIDES, "timetravel": timetravel.SIDES, "peers": tuple(goals.PEER_SIDES)}


def _listed(
    parser: argparse.ArgumentParser, text: str, allowed: Sequence[str], what: str
) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if unknown := sorted(set(items) - set(allowed)):
        parser.error(f"unknown {what} {', '.join(unknown)}: use {', '.join(allowed)}")
    return items


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="3 s per measurement, smaller logs")
    size.add_argument(
        "--smoke", action="store_true", help="a few hundred operations each: proves it runs"
    )
    parser.add_argument("--only", default="", help="sections: " + ",".join(SECTIONS))
    parser.add_argument("--skip", default="", help="sections to leave out, and/or plots")
    backends = [backend.key for backend in servers.BACKENDS]
    parser.add_argument("--backends", default="", help="of " + ",".join(backends))
    parser.add_argument("--against", metavar="REV", default="", help="also run REV's servers")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR / "latest.json")
    args = parser.parse_args(argv)
    only = _listed(parser, args.only, list(SECTIONS), "section(s)") or list(SECTIONS)
    skip = set(_listed(parser, args.skip, [*SECTIONS, "plots"], "section(s)"))
    args.sections = [key for key in SECTIONS if key in only and key not in skip]
    args.plots = "plots" not in skip
    chosen = _listed(parser, args.backends, backends, "backend(s)") or backends
    args.backends = [backend for backend in servers.BACKENDS if backend.key in chosen]
    args.scale = SCALES["smoke" if args.smoke else "quick" if args.quick else "full"]
    return args


def context(args: argparse.Namespace) -> Context:
    """The run's context: Postgres dropped from the backends when it does not answer."""
    reason = None
    if any(backend.postgres for backend in args.backends):
        reason = servers.postgres_unreachable_reason()
    backends = [b for b in args.backends if not (b.postgres and reason)]
    return Context(args.scale, backends, reason)


def judge(sections: Sequence[Section], selected: Sequence[str]) -> list[goals.Verdict]:
    """The goal lines, then the targets, from the sections' figures; a figure of a section
    that did not run says so."""
    sides = {**goals.TARGET_SIDES}
    for section, keys in SIDES.items():
        for key in keys:
            why = "failed" if section in selected else "not selected"
            sides[key] = goals.Side(key, missing=f"not measured ({section} {why})")
    for done in sections:
        sides.update(done.sides)
    return goals.judge_all(sides, (*goals.GOALS, *goals.TARGETS, *goals.GOALS_25))


def run(args: argparse.Namespace, ctx: Context) -> tuple[list[Section], list[str], list[str]]:
    """Every selected section (and the release comparison): the sections, the notes and
    the sections that failed."""
    done: list[Section] = []
    notes: list[str] = []
    failed: list[str] = []
    if ctx.postgres_reason:
        notes.append(f"postgres skipped: {ctx.postgres_reason}")
    steps: list[tuple[str, Callable[[Context], Section]]] = [
        (key, SECTIONS[key]) for key in args.sections
    ]
    if args.against:
        steps.append(("against", lambda c: against.run(args.against, c)))
    for key, section in steps:
        ctx.say(f"== {key} ==")
        try:
            done.append(section(ctx))
        except Exception as exc:  # one section's failure leaves the others' figures
            traceback.print_exc()
            failed.append(key)
            notes.append(f"section {key} failed: {type(exc).__name__}: {exc}")
    return done, notes + [note for section in done for note in section.notes], failed


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.ERROR)  # the in-process seeds' warnings are noise here
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    machine = servers.machine_info()
    ctx = context(args)
    if ctx.backend("postgres"):
        machine["postgres"] = servers.postgres_version()
    ctx.say(
        f"bench: {args.scale.name} run; sections {', '.join(args.sections) or 'none'}; "
        f"backends {', '.join(b.key for b in ctx.backends) or 'none'}; load average "
        f"{machine['loadavg'][0]:.2f} on {machine['nproc']} cores"
    )
    sections, notes, failed = run(args, ctx)
    verdicts = judge(sections, args.sections)
    goal_lines = [v.line for v in verdicts if v.goal in goals.GOALS]
    target_lines = [
        v.line.replace("goal: ", "target: ", 1) for v in verdicts if v.goal in goals.TARGETS
    ]
    printed = [f"== {section.title} ==\n{section.text}" for section in sections]
    printed.append(
        "== Goals: Switchboard against peers and floors of this run ==\n" + "\n".join(goal_lines)
    )
    printed.append("== Targets set for this machine ==\n" + "\n".join(target_lines))
    lines_25 = [
        v.line.replace("goal: ", "goal (issue 25): ", 1)
        for v in verdicts
        if v.goal in goals.GOALS_25
    ]
    printed.append("== Goals of issue 25 (the gateway stream) ==\n" + "\n".join(lines_25))
    print("\n\n".join(printed))
    machine["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    busy = machine["loadavg"][0] > 0.5
    if busy:
        notes.append(
            f"the machine was busy when the run started: load average {machine['loadavg'][0]:.2f}"
        )
    for note in notes:
        print(f"note: {note}")
    report: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "elapsed_s": round((datetime.datetime.now(datetime.UTC) - started).total_seconds(), 1),
        "scale": args.scale.name,
        "machine": machine,
        "backends": [backend.key for backend in ctx.backends],
        "sections": {section.key: section.data for section in sections},
        "goals": [v.to_json() for v in verdicts if v.goal in goals.GOALS],
        "targets": [v.to_json() for v in verdicts if v.goal in goals.TARGETS],
        "goals_25": [v.to_json() for v in verdicts if v.goal in goals.GOALS_25],
        "notes": notes,
    }
    write_json(report, args.output)
    ctx.say(f"results written to {args.output}")
    if args.plots:
        for path in write_plots(report, args.output.parent):
            print(f"plot: {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
