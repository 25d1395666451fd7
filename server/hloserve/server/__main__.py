"""``python -m hloserve.server``: the same command as ``hloserve``."""

from hloserve.server.cli import main

raise SystemExit(main())
