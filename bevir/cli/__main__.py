"""``python -m bevir.cli``: the bevir command, as ``python -m bevir``."""
from . import main

raise SystemExit(main())
