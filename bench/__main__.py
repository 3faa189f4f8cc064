"""`python -m bench`: see bench/README.md and `bench.runner`."""

from bench.runner import main

raise SystemExit(main())
