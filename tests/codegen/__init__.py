"""Tests of bevir.codegen."""
