"""`python -m gateway` is the `magnetar` command."""

from gateway._cli import main

raise SystemExit(main())
