"""Deployment-file tests; contract.py holds shared checks (assert rewriting enabled)."""

import pytest

pytest.register_assert_rewrite("tests.deploy.contract")
