"""Tests of bevir.frontends."""
