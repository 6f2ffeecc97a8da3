"""Tests of bevir.sim."""
