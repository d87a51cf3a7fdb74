"""`python -m snapcut.experiments`: the same as `snapcut experiment`."""

from snapcut.experiments.cli import main

raise SystemExit(main())
