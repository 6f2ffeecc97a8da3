"""Tests of bevir.ops."""
