"""Tests of bevir.target."""
