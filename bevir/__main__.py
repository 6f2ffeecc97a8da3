"""``python -m bevir``: the bevir command (see bevir/cli.py)."""
from .cli import main

raise SystemExit(main())
