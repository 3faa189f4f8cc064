"""One peer's measurement in a process of its own; prints its `PeerResult`s as JSON.

    python -m bench.peers.child NAME --seconds S --warmup W --repetitions N

Each peer runs in its own process so that one peer's imports, threads and
global state (ADK's, the Agents SDK's file locks) never touch another's figure,
and a crash becomes a "skipped" line instead of ending the benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from bench import servers
from bench.peers import adk, langgraph_saver, openai_agents, procrastinate_jobs
from bench.peers.common import PeerResult


def run(name: str, directory: Path, args: argparse.Namespace) -> list[PeerResult]:
    if name in ("adk-database", "adk-sqlite"):
        which = name.removeprefix("adk-")
        return asyncio.run(
            adk.measure_service(which, directory, args.seconds, args.warmup, args.repetitions)
        )
    if name == "langgraph":
        return langgraph_saver.measure(directory, args.seconds, args.warmup)
    if name == "openai-agents":
        return openai_agents.measure(directory, args.seconds, args.warmup)
    if name == "procrastinate":
        return procrastinate_jobs.measure(servers.postgres_schema, args.seconds, args.warmup)
    raise SystemExit(f"unknown peer {name!r}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.child")
    parser.add_argument("name")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--warmup", type=float, required=True)
    parser.add_argument("--repetitions", type=int, default=20)
    args = parser.parse_args(argv)
    with servers.temp_dir(f"bench-peer-{args.name}-") as directory:
        results = run(args.name, directory, args)
    json.dump([result.to_json() for result in results], sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
