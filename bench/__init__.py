"""Switchboard's benchmarks (not tests): `python -m bench`, see README.md.

- `runner`: the one runner, its command line, the goal lines and the JSON report;
- sections, each a function of a `plan.Context` returning a `plan.Section`:
  `throughput` (delivery cycles, appends and next-turn loads against floors), `claim`,
  `open_loop`, `timetravel`, `db_latency`, `feature_costs`, `reads`, `console`, the
  peers (`peers`, with `peers.goals`), and `against` (`--against REV`);
- `loadgen` (the one load generator process, closed or open loop) running the
  operations of `workloads`; `servers` (the servers, on the tests' launcher, and their
  databases); `seeding` (seeds through the services' write paths, and the wiring of
  their cores); `floors` (in-process database floors); `stats`; `report` (tables, the
  JSON report and the plots);
- `instructions`: `python -m bench.instructions`, instructions per call by callgrind.
"""
