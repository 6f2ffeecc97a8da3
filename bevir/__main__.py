"""``python -m bevir``: the bevir command (see bevir/cli/)."""
from .cli import main

raise SystemExit(main())
