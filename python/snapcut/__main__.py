from snapcut.cli import main

raise SystemExit(main())
