"""Tests of bevir.passes."""
