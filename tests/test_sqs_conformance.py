"""moto's own SQS tests (vendored in tests/third_party/moto_sqs) against the endpoint: at least
bench.sqs_suite.MIN_PASSED pass, and the failures are exactly the ones listed with their reasons
in bench.sqs_suite.EXPECTED_FAILURES (docs/sqs.md). ``python -m bench sqs-suite`` runs the same."""

from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.conformance, pytest.mark.slow, pytest.mark.timeout(1800)]

for needed in ("moto", "freezegun", "boto3", "uvicorn", "starlette"):
    if importlib.util.find_spec(needed) is None:
        pytest.skip(f"{needed} is not installed (the test extra)", allow_module_level=True)

from bench.sqs_suite import (  # noqa: E402
    EXPECTED_FAILURES,
    MIN_PASSED,
    run_suite,
    serve_harness,
)


def test_moto_sqs_suite(clean: str, request: pytest.FixtureRequest) -> None:
    if "conformance" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("a minute of moto's tests: run with -m conformance (CI's own step)")
    with serve_harness(clean) as url:
        result = run_suite(url)
    problems = result.problems(MIN_PASSED)
    assert not problems, problems
    assert sorted(EXPECTED_FAILURES) == result.failed
