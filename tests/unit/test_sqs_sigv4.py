"""The endpoint's own SigV4 check against AWS's documented example (IAM ListUsers, from the
"Signature Version 4 signing process" guide), and what a change to any signed part does."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from queue_pg.sqs import sigv4

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
AT = datetime(2015, 8, 30, 12, 36, tzinfo=timezone.utc)
HEADERS = {"content-type": "application/x-www-form-urlencoded; charset=utf-8",
           "host": "iam.amazonaws.com", "x-amz-date": "20150830T123600Z"}
QUERY = [("Action", "ListUsers"), ("Version", "2010-05-08")]
AUTH = ("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, "
        "SignedHeaders=content-type;host;x-amz-date, "
        "Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7")


def check(**changes: object) -> None:
    args: dict[str, object] = {"secret": SECRET, "method": "GET", "path": "/", "query": QUERY,
                               "headers": HEADERS, "body": b"", "now": AT}
    args.update(changes)
    sigv4.verify(sigv4.parse(AUTH), **args)  # type: ignore[arg-type]


def test_aws_documented_example_verifies() -> None:
    cred = sigv4.parse(AUTH)
    assert (cred.access_key, cred.region, cred.service) == ("AKIDEXAMPLE", "us-east-1", "iam")
    check()
    check(now=AT + timedelta(minutes=14))


@pytest.mark.parametrize("change", [
    {"secret": SECRET[:-1] + "Z"},
    {"method": "POST"},
    {"path": "/other"},
    {"query": [("Action", "DeleteUser"), ("Version", "2010-05-08")]},
    {"headers": {**HEADERS, "host": "evil.example.com"}},
    {"body": b"x"},
])
def test_any_signed_change_is_refused(change: dict[str, object]) -> None:
    with pytest.raises(sigv4.SignatureError) as err:
        check(**change)
    assert err.value.code == "SignatureDoesNotMatch"


def test_old_requests_and_malformed_headers_are_refused() -> None:
    with pytest.raises(sigv4.SignatureError) as err:
        check(now=AT + timedelta(minutes=16))
    assert err.value.code == "RequestExpired"
    with pytest.raises(sigv4.SignatureError) as err:
        check(headers={k: v for k, v in HEADERS.items() if k != "content-type"})
    assert err.value.code == "IncompleteSignature"
    for bad, code in [(None, "MissingAuthenticationToken"), ("", "MissingAuthenticationToken"),
                      ("AWS4-HMAC-SHA256 Credential=x", "IncompleteSignature"),
                      (AUTH.replace("content-type;host;", "content-type;"), "IncompleteSignature")]:
        with pytest.raises(sigv4.SignatureError) as err:
            sigv4.parse(bad)
        assert err.value.code == code
