"""Benchmarks for Switchboard (not tests): run with `python -m bench`.

`bench.delivery_cycle` drives the delivery ledger's send path over gRPC,
`bench.baseline` measures raw database floors of the same transactions;
`bench.session_load` drives the SessionService (appends, next-turn loads) and
`bench.session_baseline` measures its peewee insert floor; `bench.runner`
starts servers, runs both and prints the comparisons.
"""
