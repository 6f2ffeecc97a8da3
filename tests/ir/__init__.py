"""Tests of bevir.ir."""
