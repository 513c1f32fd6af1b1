"""CORS on the Azure endpoint (queue_pg/azure/cors.py), as Azure Storage does it: preflights
(OPTIONS, not signed) answered from the account's rules, and the Access-Control headers of actual
requests. A real uvicorn server and real PostgreSQL; clients: ``requests``, the Azure SDK (rules
set with its ``CorsRule``, actual requests with an Origin header), and a raw socket for the bytes
``requests`` will not send. Origins and header lists are treated as hostile.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from psycopg.types.json import Jsonb

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("azure.storage.queue")
requests = pytest.importorskip("requests")
aiohttp = pytest.importorskip("aiohttp")

from azure.core.exceptions import HttpResponseError, ResourceNotFoundError  # noqa: E402
from azure.storage.queue import CorsRule, QueueServiceClient  # noqa: E402

from bench.sqs_suite import serve  # noqa: E402
from queue_pg.azure import create_app  # noqa: E402
from tests.test_access import CONSUMER, PRODUCER, MakeRole, make_role  # noqa: E402, F401
from tests.test_azure import _conn_str, _key, code  # noqa: E402

APP = "https://app.example"
OTHER = "https://evil.example"
FAILED = "CORS not enabled or no matching rule found for this request."


class Served:
    """The endpoint under test: its URL and its app (to read the rule cache's counters)."""

    def __init__(self, url: str, app: Any) -> None:
        self.url, self.app = url, app

    @property
    def reads(self) -> int:
        return int(self.app.state.endpoint.cors.reads)


@pytest.fixture(scope="module")
def served(dsn: str) -> Iterator[Served]:
    """One server for the module; its rules are cached for an hour, so any read a test sees
    is one a change made through the endpoint asked for (or the first)."""
    app = create_app(dsn, cors_ttl=3600)
    with serve(app) as url:
        yield Served(url, app)


MakeAccount = Callable[..., tuple[QueueServiceClient, str]]


@pytest.fixture
def make_account(clean: str, served: Served) -> MakeAccount:
    """``make_account(role=None)``: (QueueServiceClient, account) of a new key of ``role``
    (None: the database's owner)."""

    def make(role: str | None = None) -> tuple[QueueServiceClient, str]:
        if role is None:
            with psycopg.connect(clean) as c:
                row = c.execute("SELECT current_user").fetchone()
                assert row is not None
                role = str(row[0])
        account, key = _key(clean, role)
        svc = QueueServiceClient.from_connection_string(_conn_str(served.url, account, key),
                                                        retry_total=0)
        return svc, account

    return make


def rule(origins: list[str], methods: list[str], *, allowed: list[str] | None = None,
         exposed: list[str] | None = None, max_age: int = 600) -> CorsRule:
    return CorsRule(origins, methods, allowed_headers=allowed or [],
                    exposed_headers=exposed or [], max_age_in_seconds=max_age)


def preflight(url: str, origin: str | None, method: str | None,
              headers: str | None = None) -> requests.Response:
    sent = {k: v for k, v in (("Origin", origin), ("Access-Control-Request-Method", method),
                              ("Access-Control-Request-Headers", headers)) if v is not None}
    return requests.options(url, headers=sent, timeout=30)


def cors_headers(headers: Any) -> dict[str, str]:
    """The response's CORS headers (and Vary), lower-case names."""
    return {k.lower(): v for k, v in headers.items()
            if k.lower().startswith("access-control-") or k.lower() == "vary"}


def raw_request(url: str, lines: list[bytes]) -> tuple[int, list[tuple[bytes, bytes]]]:
    """Send a request as given bytes (a header each line) over a socket; the status and the
    response's header lines as they came (nothing decoded or folded)."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(b"\r\n".join([*lines, b"Host: " + parts.netloc.encode(), b"Connection: close",
                                b"", b""]))
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    status = int(head[0].split(b" ")[1])
    return status, [tuple(h.split(b":", 1)) for h in head[1:]]  # type: ignore[misc]


# --- preflights ---------------------------------------------------------------------------------

def test_without_rules_a_preflight_is_refused_and_no_cors_headers_are_sent(
        make_account: MakeAccount, served: Served) -> None:
    svc, account = make_account()
    got = preflight(f"{served.url}/{account}?restype=service&comp=properties", APP, "GET")
    assert got.status_code == 403
    assert got.headers["x-ms-error-code"] == "CorsPreflightFailure"
    assert FAILED in got.text and cors_headers(got.headers) == {}
    seen: dict[str, str] = {}
    svc.get_service_properties(headers={"Origin": APP},
                               raw_response_hook=lambda r: seen.update(r.http_response.headers))
    assert seen and cors_headers(seen) == {}  # no rules: nothing, not even Vary


def test_preflight_allowed_and_refused_by_origin_method_and_headers(
        make_account: MakeAccount, served: Served) -> None:
    svc, account = make_account()
    svc.set_service_properties(cors=[rule([APP, "http://localhost:3000"], ["GET", "PUT"],
                                          allowed=["x-ms-meta-*", "x-ms-version"], max_age=600)])
    url = f"{served.url}/{account}/orders/messages"
    got = preflight(url, APP, "PUT", "x-ms-version, X-MS-META-Team")
    assert got.status_code == 200, got.text
    assert cors_headers(got.headers) == {
        "access-control-allow-origin": APP, "access-control-allow-methods": "PUT",
        "access-control-allow-headers": "x-ms-version,X-MS-META-Team",
        "access-control-max-age": "600", "access-control-allow-credentials": "true"}
    assert got.content == b""
    # the second origin of the list; methods compare without case, origins with (as Azure)
    assert preflight(url, "http://localhost:3000", "get").status_code == 200
    assert preflight(url, "HTTPS://APP.EXAMPLE", "GET").status_code == 403
    for origin, method, headers in [(OTHER, "GET", None),           # origin not listed
                                    (APP + ":8443", "GET", None),   # another origin
                                    (APP, "DELETE", None),          # method not allowed
                                    (APP, "TRACE", None),           # not a method at all
                                    (APP, "GET", "x-ms-version,x-custom"),  # one header not
                                    (APP, "GET", "x-ms-met")]:      # not the prefix
        refused = preflight(url, origin, method, headers)
        assert refused.status_code == 403, (origin, method, headers)
        assert refused.headers["x-ms-error-code"] == "CorsPreflightFailure"
        assert FAILED in refused.text and cors_headers(refused.headers) == {}
    for origin, method, missing in [(None, "GET", "Origin"),
                                    (APP, None, "Access-Control-Request-Method")]:
        bad = preflight(url, origin, method)
        assert bad.status_code == 400 and bad.headers["x-ms-error-code"] == "MissingRequiredHeader"
        assert "A required CORS header is not present." in bad.text and missing in bad.text


def test_a_preflight_says_nothing_of_queues_and_costs_no_read_of_its_own(
        make_account: MakeAccount, served: Served, clean: str) -> None:
    svc, account = make_account()
    svc.create_queue("exists")
    svc.set_service_properties(cors=[rule([APP], ["GET", "POST"])])
    _, bare = make_account()  # an account with no rules, and one that does not exist
    paths = [f"{account}/exists/messages", f"{account}/missing/messages", f"{account}/exists",
             f"{account}/missing", f"{account}/NOT_A_QUEUE/x/y", f"{account}-secondary/exists",
             account, f"{account}?comp=list"]
    answers = set()
    for path in paths:
        got = preflight(f"{served.url}/{path}", APP, "POST")
        answers.add((got.status_code, tuple(sorted(cors_headers(got.headers).items()))))
    assert len(answers) == 1 and next(iter(answers))[0] == 200  # the same, queue or not
    refusals = set()
    for path in [f"{bare}/exists", f"{bare}/missing", "nosuchacct1/exists", "nosuchacct1",
                 "NO-SUCH/exists", "x"]:
        got = preflight(f"{served.url}/{path}", APP, "POST")
        refusals.add((got.status_code, got.headers.get("x-ms-error-code"), got.content[:60]))
    assert refusals == {(403, "CorsPreflightFailure", next(iter(refusals))[2])}

    # many preflights at once, for any account and queue: the rules already read serve them all
    before = served.reads

    async def flood() -> list[int]:
        async with aiohttp.ClientSession() as session:
            async def one(i: int) -> int:
                path = [f"{account}/q{i}", f"acct{i:06d}/q", f"{account}/exists/messages"][i % 3]
                async with session.options(f"{served.url}/{path}", headers={
                        "Origin": APP, "Access-Control-Request-Method": "GET"}) as r:
                    return r.status
            return await asyncio.gather(*(one(i) for i in range(300)))

    statuses = asyncio.run(flood())
    assert statuses.count(200) == 200 and statuses.count(403) == 100
    assert served.reads == before  # not one read more
    # rules to read again (as after a change): the 300 at once share one read
    served.app.state.endpoint.cors.invalidate()
    statuses = asyncio.run(flood())
    assert statuses.count(200) == 200 and statuses.count(403) == 100
    assert served.reads == before + 1


def test_wildcard_origins_and_rules_in_order(make_account: MakeAccount, served: Served) -> None:
    svc, account = make_account()
    q = svc.create_queue("jobs")
    svc.set_service_properties(cors=[
        rule([APP], ["GET"], exposed=["x-ms-meta-*", "x-ms-request-id", "ETag"]),
        rule(["*"], ["GET", "POST", "PUT"], allowed=["*"], exposed=["x-ms-*"])])
    url = f"{served.url}/{account}/jobs/messages"
    # a preflight under the * rule echoes the origin (Azure's preflight), any header allowed
    got = preflight(url, "null", "PUT", "x-anything,content-type")
    assert got.status_code == 200
    assert got.headers["access-control-allow-origin"] == "null"
    assert got.headers["access-control-allow-headers"] == "x-anything,content-type"

    def actual(origin: str, call: Callable[..., Any], *args: Any) -> dict[str, str]:
        seen: dict[str, str] = {}
        call(*args, headers={"Origin": origin},
             raw_response_hook=lambda r: seen.update(r.http_response.headers))
        return {k.lower(): v for k, v in seen.items()}

    q.set_queue_metadata({"team": "shop"})
    # the first rule matching wins: the exact origin, with Vary and credentials
    h = actual(APP, q.get_queue_properties)
    assert h["access-control-allow-origin"] == APP and h["vary"] == "Origin"
    assert h["access-control-allow-credentials"] == "true"
    exposed = h["access-control-expose-headers"].split(",")
    assert "x-ms-meta-team" in exposed and "x-ms-request-id" in exposed and "ETag" in exposed
    assert "x-ms-version" not in exposed  # not the first rule's
    # another origin falls to the * rule: "*", no Vary, no credentials; its x-ms-* prefix
    h = actual(OTHER, q.get_queue_properties)
    assert h["access-control-allow-origin"] == "*"
    assert "vary" not in h and "access-control-allow-credentials" not in h
    assert {"x-ms-request-id", "x-ms-version", "x-ms-meta-team",
            "x-ms-approximate-messages-count"} <= set(h["access-control-expose-headers"].split(","))
    # a POST (Put Message) from the exact origin: only the * rule allows POST
    h = actual(APP, q.send_message, "hello")
    assert h["access-control-allow-origin"] == "*" and "vary" not in h


def test_actual_requests_errors_included_and_vary_without_a_match(
        make_account: MakeAccount, served: Served) -> None:
    svc, account = make_account()
    svc.set_service_properties(cors=[rule([APP], ["GET", "DELETE"], exposed=["x-ms-error-code"])])
    missing = svc.get_queue_client("nosuchqueue")
    with pytest.raises(ResourceNotFoundError) as err:  # errors carry them too
        missing.get_queue_properties(headers={"Origin": APP})
    assert err.value.response is not None
    h = {k.lower(): v for k, v in err.value.response.headers.items()}
    assert h["access-control-allow-origin"] == APP and h["vary"] == "Origin"
    assert h["access-control-expose-headers"] == "x-ms-error-code"
    # rules, but none for this origin: GET and HEAD say they vary by Origin, and allow nothing
    seen: dict[str, str] = {}
    svc.get_service_properties(headers={"Origin": OTHER},
                               raw_response_hook=lambda r: seen.update(r.http_response.headers))
    assert cors_headers(seen) == {"vary": "Origin"}
    # any other method: nothing (Azure sets Vary on GET and HEAD only)
    svc.create_queue("made")
    seen.clear()
    svc.delete_queue("made", headers={"Origin": OTHER},
                     raw_response_hook=lambda r: seen.update(r.http_response.headers))
    assert seen and cors_headers(seen) == {}
    # without an Origin: no CORS headers at all
    seen.clear()
    svc.get_service_properties(raw_response_hook=lambda r: seen.update(r.http_response.headers))
    assert cors_headers(seen) == {}
    # an unsigned request is refused, and still says so to the allowed origin
    got = requests.get(f"{served.url}/{account}?comp=list", headers={"Origin": APP}, timeout=30)
    assert got.status_code == 403 and got.headers["access-control-allow-origin"] == APP


def test_rules_changed_by_set_service_properties_apply_at_once(
        make_account: MakeAccount, served: Served) -> None:
    svc, account = make_account()
    url = f"{served.url}/{account}/q1"
    assert preflight(url, APP, "GET").status_code == 403
    svc.set_service_properties(cors=[rule([APP], ["GET"])])
    assert preflight(url, APP, "GET").status_code == 200
    assert preflight(url, OTHER, "GET").status_code == 403
    svc.set_service_properties(cors=[rule([OTHER], ["GET"], max_age=5)])
    assert preflight(url, APP, "GET").status_code == 403
    got = preflight(url, OTHER, "GET")
    assert got.status_code == 200 and got.headers["access-control-max-age"] == "5"
    svc.set_service_properties(hour_metrics=None, cors=None)  # CORS not given: kept, as Azure
    assert preflight(url, OTHER, "GET").status_code == 200
    svc.set_service_properties(cors=[])
    assert preflight(url, OTHER, "GET").status_code == 403
    seen: dict[str, str] = {}
    svc.get_service_properties(headers={"Origin": OTHER},
                               raw_response_hook=lambda r: seen.update(r.http_response.headers))
    assert cors_headers(seen) == {}


def test_rules_changed_elsewhere_apply_within_the_ttl(dsn: str, clean: str) -> None:
    """Another process (here: SQL) changes the rules: this endpoint reads them again after its
    ttl, not on every request."""
    with psycopg.connect(clean, autocommit=True) as c:
        row = c.execute("SELECT current_user").fetchone()
        assert row is not None
        account, _ = _key(clean, str(row[0]))
    app = create_app(dsn, cors_ttl=0.5)
    with serve(app) as url, psycopg.connect(clean, autocommit=True) as c:
        assert preflight(f"{url}/{account}", APP, "GET").status_code == 403
        c.execute("SELECT queue_pg.azure_set_service_properties(%s, %s)", [account, Jsonb(
            {"Cors": [{"AllowedOrigins": APP, "AllowedMethods": "GET", "MaxAgeInSeconds": "1"}]})])
        for _ in range(600):  # the ttl passes (the loop bounds the wait; speed is not asserted)
            if preflight(f"{url}/{account}", APP, "GET").status_code == 200:
                break
            asyncio.run(asyncio.sleep(0.1))
        assert preflight(f"{url}/{account}", APP, "GET").status_code == 200
        reads = app.state.endpoint.cors.reads
        assert reads >= 2
        for _ in range(20):
            preflight(f"{url}/{account}", APP, "GET")
        assert app.state.endpoint.cors.reads <= reads + 20 // 2  # not a read each


# --- hostile input ------------------------------------------------------------------------------

def test_hostile_origins_and_header_lists(make_account: MakeAccount, served: Served) -> None:
    svc, account = make_account()
    svc.create_queue("qq1")
    svc.set_service_properties(cors=[rule(["*"], ["GET", "PUT"], allowed=["*"],
                                          exposed=["x-ms-*"])])
    url = f"{served.url}/{account}/qq1"
    assert preflight(url, "https://" + "a" * 241 + ".example", "GET").status_code == 403  # 257
    assert preflight(url, "https://" + "a" * 240 + ".example", "GET").status_code == 200  # 256
    for origin in ["https://a.example, https://b.example", "https://a .example", "x\ty"]:
        assert preflight(url, origin, "GET").status_code == 403, origin
    assert preflight(url, APP, "GET", ",".join(f"x-h{i}" for i in range(65))).status_code == 403
    assert preflight(url, APP, "GET", ",".join(f"x-h{i}" for i in range(64))).status_code == 200
    for headers in ["x-ok, bad header", "x-ok,a:b", "x-" + "h" * 300, "x," * 2100]:
        assert preflight(url, APP, "GET", headers).status_code == 403, headers[:40]

    # bytes requests will not send: non-ASCII origins, a header smuggled after a bare CR or LF
    path = f"/{account}/qq1".encode()
    for origin in [b"https://\xc3\xa4.example", b"https://a.example\rSet-Cookie: x=1",
                   b"https://a.example\nSet-Cookie: x=1", b"https://a.example\x00"]:
        status, headers = raw_request(served.url, [
            b"OPTIONS " + path + b" HTTP/1.1", b"Origin: " + origin,
            b"Access-Control-Request-Method: GET"])
        names = [h[0].strip().lower() for h in headers]
        assert b"set-cookie" not in names
        assert status in (400, 403), (origin, status)  # refused by the parser or by the rules
        assert b"access-control-allow-origin" not in names
        status, headers = raw_request(served.url, [b"GET " + path + b"?comp=metadata HTTP/1.1",
                                                   b"Origin: " + origin])
        names = [h[0].strip().lower() for h in headers]
        assert b"set-cookie" not in names and b"access-control-allow-origin" not in names


def test_rules_that_could_inject_headers_or_exceed_azures_limits_are_refused(
        make_account: MakeAccount, served: Served, clean: str) -> None:
    svc, account = make_account()
    good = rule([APP], ["GET"], exposed=["x-ms-request-id"])
    svc.set_service_properties(cors=[good])
    bad_rules = [
        rule([APP], ["GET"], exposed=["x-ms-request-id\r\nSet-Cookie: a=1"]),
        rule([APP], ["GET"], allowed=["x ms"]),
        rule([APP + "\r\nX-Injected: 1"], ["GET"]),
        rule([APP], ["TRACE"]),
        rule([f"https://o{i}.example" for i in range(65)], ["GET"]),
        rule([APP], ["GET"], exposed=["a*", "b*", "c*"]),
        rule([APP], ["GET"], allowed=[f"x-h{i}" for i in range(65)]),
        rule(["https://" + "a" * 250 + ".example"], ["GET"]),
        rule([f"https://{'o' * 200}{i}.example" for i in range(10)], ["GET"]),  # > 2 KiB
    ]
    for bad in bad_rules:
        with pytest.raises(HttpResponseError) as err:
            svc.set_service_properties(cors=[bad])
        assert code(err) == "InvalidInput"
        assert err.value.status_code == 400
    got = svc.get_service_properties()["cors"]
    assert [(c.allowed_origins, c.exposed_headers) for c in got] == [(APP, "x-ms-request-id")]

    # rules written past the check (the owner's own INSERT): what is not a token never goes out
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("UPDATE queue_pg.azure_service_properties SET properties = %s"
                  " WHERE account = %s", [Jsonb({"Cors": [{
                      "AllowedOrigins": f"{APP}, bad origin\r\nX: 1",
                      "AllowedMethods": "GET,TRACE\r\n",
                      "ExposedHeaders": "x-ms-request-id,x\r\nSet-Cookie: a",
                      "MaxAgeInSeconds": "-5"}]}), account])
    served.app.state.endpoint.cors.invalidate()
    got_pre = preflight(f"{served.url}/{account}", APP, "GET")
    assert got_pre.status_code == 200 and got_pre.headers["access-control-max-age"] == "0"
    _, headers = raw_request(served.url, [
        f"GET /{account}/qq1?comp=metadata HTTP/1.1".encode(), b"Origin: " + APP.encode()])
    lines = dict((k.strip().lower(), v.strip()) for k, v in headers)
    assert b"set-cookie" not in lines and b"x" not in lines
    assert lines[b"access-control-expose-headers"] == b"x-ms-request-id"
    assert lines[b"access-control-allow-origin"] == APP.encode()


def test_rules_are_each_accounts_own_and_read_by_the_owner_only(
        make_account: MakeAccount, make_role: MakeRole, served: Served,  # noqa: F811
        clean: str) -> None:
    """A key whose role has a grant on one queue only sets its own account's rules, which
    apply to that account alone; the rules of every account are the owner's to read."""
    owner_svc, _ = make_account()
    owner_svc.create_queue("mine")
    owner_svc.create_queue("theirs")
    weak = make_role("azcors", PRODUCER, CONSUMER)
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.grant('mine', %s, 'send')", [weak.name])
    svc, account = make_account(weak.name)
    _, other_account = make_account()
    svc.set_service_properties(cors=[rule([APP], ["GET"])])
    assert [c.allowed_origins for c in svc.get_service_properties()["cors"]] == [APP]
    for queue in ("mine", "theirs", "none"):  # the same answer: a preflight is not its grants'
        got = preflight(f"{served.url}/{account}/{queue}/messages", APP, "GET")
        assert got.status_code == 200 and got.headers["access-control-allow-origin"] == APP
    assert preflight(f"{served.url}/{other_account}/mine", APP, "GET").status_code == 403
    with weak.connect() as c, pytest.raises(psycopg.Error) as denied:
        c.execute("SELECT * FROM queue_pg.azure_cors_rules()")
    assert "permission denied" in str(denied.value)


def test_rules_it_cannot_read_refuse_preflights_and_add_no_headers(
        make_role: MakeRole, clean: str) -> None:  # noqa: F811
    """--no-auth as a role that is not the owner: the rules cannot be read, so preflights are
    refused and actual requests carry no CORS headers (fail closed), and nothing else breaks."""
    dev = make_role("azcorsdev", PRODUCER, CONSUMER)
    with psycopg.connect(clean, autocommit=True) as c:
        c.execute("SELECT queue_pg.azure_set_service_properties('devacct', %s)", [Jsonb(
            {"Cors": [{"AllowedOrigins": "*", "AllowedMethods": "GET", "MaxAgeInSeconds": "1"}]})])
    with serve(create_app(dev.dsn, auth=False)) as url:
        got = preflight(f"{url}/devacct/jobs", APP, "GET")
        assert got.status_code == 403 and cors_headers(got.headers) == {}
        assert got.headers["x-ms-error-code"] == "AuthorizationPermissionMismatch"
        listed = requests.get(f"{url}/devacct?comp=list", headers={"Origin": APP}, timeout=30)
        assert listed.status_code == 200 and cors_headers(listed.headers) == {}
