"""Tests of bevir.flows."""
