"""`python -m fastload`: the command-line interface."""

from fastload.cli import main

raise SystemExit(main())
