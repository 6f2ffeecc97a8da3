"""bevir's test suite: one package per package of bevir (see docs/contributing.md)."""
