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


def _presigned(expires: int = 60) -> tuple[list[tuple[str, str]], datetime]:
    """A GET query-protocol request presigned by botocore's SigV4QueryAuth: its query pairs and
    the time it was signed at."""
    from urllib.parse import parse_qsl, urlsplit

    auth = pytest.importorskip("botocore.auth")
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    req = AWSRequest("GET", "http://127.0.0.1:9324/000000000000/q?Action=ReceiveMessage"
                            "&Version=2012-11-05&MaxNumberOfMessages=1")
    auth.SigV4QueryAuth(Credentials("AKQPEXAMPLE", SECRET), "sqs", "us-east-1",
                        expires=expires).add_auth(req)
    pairs = parse_qsl(urlsplit(req.url).query, keep_blank_values=True)
    at = datetime.strptime(dict(pairs)["X-Amz-Date"], "%Y%m%dT%H%M%SZ").replace(
        tzinfo=timezone.utc)
    return pairs, at


def presigned_check(pairs: list[tuple[str, str]], now: datetime, body: bytes = b"",
                    host: str = "127.0.0.1:9324", path: str = "/000000000000/q") -> None:
    sigv4.verify_presigned(sigv4.parse_presigned(pairs), SECRET, "GET", path, pairs,
                           {"host": host}, body, now=now)


def test_presigned_urls_verify_until_they_expire() -> None:
    pairs, at = _presigned(60)
    assert sigv4.is_presigned(pairs)
    presigned_check(pairs, at)
    presigned_check(pairs, at + timedelta(seconds=60))
    for now, code in [(at + timedelta(seconds=61), "RequestExpired"),
                      (at - timedelta(minutes=16), "RequestExpired")]:
        with pytest.raises(sigv4.SignatureError) as err:
            presigned_check(pairs, now)
        assert err.value.code == code


@pytest.mark.parametrize("change", [
    {"pairs": "MaxNumberOfMessages=10"}, {"pairs": "X-Amz-Expires=3600"},
    {"pairs": "extra"}, {"host": "evil.example.com"}, {"path": "/000000000000/other"},
])
def test_presigned_changes_are_refused(change: dict[str, str]) -> None:
    pairs, at = _presigned()
    kw: dict[str, str] = {k: v for k, v in change.items() if k != "pairs"}
    if change.get("pairs") == "extra":
        pairs = [*pairs, ("VisibilityTimeout", "0")]
    elif "pairs" in change:
        name, value = change["pairs"].split("=")
        pairs = [(k, value if k == name else v) for k, v in pairs]
    with pytest.raises(sigv4.SignatureError) as err:
        presigned_check(pairs, at, **kw)
    assert err.value.code == "SignatureDoesNotMatch"


def test_presigned_malformed_or_with_a_body_is_refused() -> None:
    pairs, at = _presigned()
    with pytest.raises(sigv4.SignatureError) as err:
        presigned_check(pairs, at, body=b"Action=DeleteQueue")
    assert err.value.code == "IncompleteSignature"
    for edit, code in [
        (lambda p: [x for x in p if x[0] != "X-Amz-Signature"], "IncompleteSignature"),
        (lambda p: [*p, ("X-Amz-Date", "20990101T000000Z")], "IncompleteSignature"),
        (lambda p: [(k, "0" if k == "X-Amz-Expires" else v) for k, v in p],
         "AuthorizationQueryParametersError"),
        (lambda p: [(k, "604801" if k == "X-Amz-Expires" else v) for k, v in p],
         "AuthorizationQueryParametersError"),
        (lambda p: [(k, "AWS4-HMAC-SHA1" if k == "X-Amz-Algorithm" else v) for k, v in p],
         "IncompleteSignature"),
    ]:
        with pytest.raises(sigv4.SignatureError) as err:
            sigv4.parse_presigned(edit(pairs))
        assert err.value.code == code


def _cred(region: str = "us-east-1", service: str = "sqs",
          signed: tuple[str, ...] = ("content-type", "host", "x-amz-date", "x-amz-target")
          ) -> sigv4.Credential:
    return sigv4.Credential("AKID", "20150830", region, service, signed, "0" * 64)


def test_scope_must_be_our_region_and_sqs() -> None:
    headers = {"host": "h", "x-amz-date": "d", "x-amz-target": "AmazonSQS.PurgeQueue",
               "content-type": "application/x-amz-json-1.0"}
    sigv4.check_scope(_cred(), "us-east-1", headers)
    sigv4.check_scope(_cred("eu-west-1"), "eu-west-1", headers)
    for cred, code in [(_cred(service="s3"), "SignatureDoesNotMatch"),
                       (_cred("xx-made-up-1"), "SignatureDoesNotMatch"),
                       (_cred(signed=("host", "x-amz-date")), "IncompleteSignature"),
                       (_cred(signed=("host", "x-amz-date", "x-amz-target")), "IncompleteSignature"),
                       (_cred(signed=("content-type", "host", "x-amz-target")),
                        "IncompleteSignature")]:
        with pytest.raises(sigv4.SignatureError) as err:
            sigv4.check_scope(cred, "us-east-1", headers)
        assert err.value.code == code, cred


def test_query_requests_and_presigned_urls_need_less_signed() -> None:
    """A query request's action is in its signed body (its content type may go unsigned, as boto
    2 leaves it); a presigned URL signs its date in the query."""
    form = {"host": "h", "x-amz-date": "d", "content-type": "application/x-www-form-urlencoded"}
    sigv4.check_scope(_cred(signed=("host", "x-amz-date")), "us-east-1", form)
    sigv4.check_scope(_cred(signed=("host",)), "us-east-1", {"host": "h"}, presigned=True)
    with pytest.raises(sigv4.SignatureError):
        sigv4.check_scope(_cred(signed=("host",)), "us-east-1", form)
