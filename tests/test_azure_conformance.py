"""Azurite's own queue tests (vendored in tests/third_party/azurite_queue, MIT; Microsoft's
JavaScript SDK under mocha) against ``queue-pg azure``: at least bench.azure_suite.MIN_PASSED
pass, and the failures are exactly the ones listed with their reasons in
bench.azure_suite.EXPECTED_FAILURES (docs/azure.md). ``python -m bench azure-suite`` runs the same.

The SDK comes from npm into that folder's node_modules (``npm ci``: .ci/run does it, from the
lock file), never at test time. Without it the test skips, saying so, unless
QUEUE_PG_REQUIRE_AZURITE_TESTS=1 (set by .ci/run), when it fails."""

from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = [pytest.mark.conformance, pytest.mark.slow, pytest.mark.timeout(1200)]

for needed in ("uvicorn", "starlette", "cryptography"):
    if importlib.util.find_spec(needed) is None:
        pytest.skip(f"{needed} is not installed (the azure extra)", allow_module_level=True)

from bench.azure_suite import (  # noqa: E402
    EXPECTED_FAILURES,
    MIN_PASSED,
    missing,
    run_suite,
    serve_endpoint,
)


def test_azurite_queue_suite(clean: str, request: pytest.FixtureRequest) -> None:
    if "conformance" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a minute of Azurite's tests: run with -m conformance (CI's own step)")
    why = missing()
    if why:
        if os.environ.get("QUEUE_PG_REQUIRE_AZURITE_TESTS") == "1":
            pytest.fail(f"QUEUE_PG_REQUIRE_AZURITE_TESTS=1 but {why}")
        pytest.skip(why)
    with serve_endpoint(clean):
        result = run_suite()
    problems = result.problems(MIN_PASSED)
    assert not problems, problems
    assert sorted(EXPECTED_FAILURES) == result.failed
