"""Tests of bevir.testing (golden runs, reports, the pytest plugin)."""
