"""Tests of bevir.scale."""
