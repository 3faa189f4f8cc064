"""`python -m bench`: the delivery-cycle benchmark."""

from bench.runner import main

raise SystemExit(main())
