"""Benchmarks for Switchboard (not tests): run with `python -m bench` (see README.md).

Load generators, each its own process: `bench.delivery_cycle` (delivery cycles,
closed loop), `bench.claim_load` (claiming a dead instance's orphans, seeded by
`bench.orphans`), `bench.session_load` (appends, next-turn loads),
`bench.open_loop` (either service on a fixed schedule). In-process floors:
`bench.baseline` (raw drivers) and `bench.session_baseline` (peewee). In-process
peers (`bench.peers`, with the `bench` extra): ADK, LangGraph, OpenAI Agents,
procrastinate, and the goal lines comparing Switchboard with them.
`bench.runner` starts servers, runs everything and prints the comparisons;
`bench.session_runner`, `bench.latency` and `bench.timetravel` do their parts;
`bench.plots` draws the PNG plots from the JSON report.
"""
