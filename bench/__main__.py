"""`python -m bench`: Switchboard's benchmarks, the in-process peers and the goal lines
(see bench/README.md and `bench.runner`)."""

from bench.runner import main

raise SystemExit(main())
