"""Security through the real app: bad OIDC tokens decide nothing, and no token or payload ever reaches a log line.

The app is `create_app(engine, PushAuthenticator(...))` on the embedded SQLite store with
an in-memory publisher and recorder, driven in-process through `httpx.ASGITransport`;
the authenticator fetches its certificates over HTTP from `LocalGoogleCerts`, a local
stand-in for Google's endpoint that signs tokens with the key it publishes.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from pubsub_filter.backends.stores.guard import GuardedStore
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.core.model import Decision
from pubsub_filter.push.app import create_app
from pubsub_filter.push.auth import PushAuthenticator
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.jsonlogs import logs_into
from tests.support.oidc import LocalGoogleCerts, SigningKey, google_claims

pytestmark = pytest.mark.faults

AUDIENCE = "https://filter.example.run.app"
PUSHER = "pusher@p.iam.gserviceaccount.com"
SUB = "projects/p/subscriptions/raw-reports"
SECRET = "S3CRET-PAYLOAD-d41c9e-77"  # in payloads and rejected bodies: must never be logged
TOKEN_MARK = "T0KEN-MARK-5b7f0a"  # in the claims of every token sent: must never be logged
CONFIG: dict[str, Any] = {
    "server": {"max_body": 16 * 1024},
    "routes": [
        {"name": "reports", "destination": "phase3", "key": ["payload.game_date"]},
        {"name": "raw", "destination": "phase3", "key": ["attributes.id"]},
    ],
}


@dataclass
class App:
    client: httpx.AsyncClient
    engine: Engine
    store: SqliteStore
    publisher: MemoryPublisher
    recorder: MemoryRecorder
    google: LocalGoogleCerts

    async def push(self, body: bytes, token: str | None = None, route: str = "reports") -> httpx.Response:
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        return await self.client.post(f"/push/{route}", content=body, headers=headers)

    def token(self, email: str | None = PUSHER, **overrides: Any) -> str:
        """A token as Pub/Sub's push service account gets it, with `overrides` in its claims."""
        return self.google.sign(claims(email, **overrides))


@pytest.fixture(scope="module")
def google() -> Iterator[LocalGoogleCerts]:
    """One endpoint and key for the module (RSA keys are slow to make); each test has its own authenticator."""
    with LocalGoogleCerts() as g:
        yield g


@pytest.fixture
async def app(tmp_path: Path, google: LocalGoogleCerts) -> AsyncIterator[App]:
    cfg = parse(CONFIG)
    store = SqliteStore(tmp_path / "state.db")
    publisher, recorder = MemoryPublisher(), MemoryRecorder()
    engine = Engine(cfg, GuardedStore(store, cfg.store_errors), publisher, recorder)
    auth = PushAuthenticator(audience=AUDIENCE, service_account=PUSHER, certs_url=google.url)
    transport = httpx.ASGITransport(app=create_app(engine, auth))
    async with httpx.AsyncClient(transport=transport, base_url="http://filter") as client:
        yield App(client, engine, store, publisher, recorder, google)
    await store.close()


def envelope(payload: Any, message_id: str = "m1", **kw: Any) -> bytes:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    kw.setdefault("subscription", SUB)
    return make_envelope(data, message_id, **kw)


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsigned(google: LocalGoogleCerts, claims: dict[str, Any], alg: str = "none") -> str:
    """A token with `alg` in its header and no valid signature (`none`; or `HS256`, keyed with the public cert)."""
    header = _b64url(json.dumps({"alg": alg, "kid": google.kid, "typ": "JWT"}).encode())
    body = _b64url(json.dumps(claims).encode())
    if alg == "none":
        return f"{header}.{body}."
    import hashlib
    import hmac

    cert = google.document()[google.kid].encode()
    signature = hmac.new(cert, f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{_b64url(signature)}"


def tampered(token: str, **claims: Any) -> str:
    """A valid token whose claims segment was swapped for other claims: the signature no longer matches."""
    header, _, signature = token.split(".")
    return f"{header}.{_b64url(json.dumps(claims).encode())}.{signature}"


def claims(email: str | None = PUSHER, **overrides: Any) -> dict[str, Any]:
    """Pub/Sub push token claims (`None` removes one), all carrying TOKEN_MARK."""
    return google_claims(audience=AUDIENCE, email=email, note=TOKEN_MARK, **overrides)  # type: ignore[arg-type]


#: name → (make the Authorization token or None for no header, the status expected).
BAD_TOKENS: dict[str, tuple[Callable[[App], str | None], int]] = {
    "forged": (lambda a: a.google.forge(claims()), 401),
    "expired": (lambda a: a.token(issued_at=time.time() - 7200, lifetime=3600), 401),
    "wrong audience": (lambda a: a.token(aud="https://someone-else.run.app"), 401),
    "wrong issuer": (lambda a: a.token(iss="https://evil.example.com"), 401),
    "wrong email": (lambda a: a.token(email="intruder@p.iam.gserviceaccount.com"), 403),
    "email not verified": (lambda a: a.token(email_verified=False), 403),
    "email_verified as a string": (lambda a: a.token(email_verified="true"), 403),
    "no email": (lambda a: a.token(email=None), 403),
    "missing token": (lambda a: None, 401),
    "not yet valid": (lambda a: a.token(issued_at=time.time() + 3600, nbf=int(time.time()) + 3600), 401),
    "no expiry": (lambda a: a.token(exp=None), 401),
    "no issued-at": (lambda a: a.token(iat=None), 401),
    "alg none": (lambda a: unsigned(a.google, claims()), 401),
    "HS256 keyed with the public cert": (lambda a: unsigned(a.google, claims(), alg="HS256"), 401),
    "claims swapped under a valid signature": (
        lambda a: tampered(a.token(aud="https://someone-else.run.app"), **claims()),
        401,
    ),
    "signed by an unpublished key": (lambda a: SigningKey.generate().sign(claims()), 401),
    "not a JWT": (lambda a: f"{TOKEN_MARK}.{TOKEN_MARK}", 401),
    "empty": (lambda a: "", 401),
}


# --- bad tokens decide nothing ---------------------------------------------------------


@pytest.mark.loop_may_block("it signs RSA tokens in its body, between requests")
@pytest.mark.parametrize("case", list(BAD_TOKENS))
async def test_a_bad_token_is_rejected_and_the_message_is_not_decided(app: App, case: str) -> None:
    make, status = BAD_TOKENS[case]
    token = make(app)
    body = envelope({"game_date": "2025-01-10", "v": 1}, "m1")
    headers = {} if token is None else {"Authorization": f"Bearer {token}" if token else "Bearer "}
    r = await app.client.post("/push/reports", content=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.json()["error"] and "decision" not in r.json()
    # nothing decided: no record, no publish, no state for the key
    assert app.recorder.records == []
    assert (app.publisher.attempts, app.publisher.published) == (0, [])
    assert await app.store.read("reports", "2025-01-10") is None
    # ... so the same message, pushed again with a good token, is new: forwarded, not a duplicate
    r = await app.push(body, app.token())
    assert (r.status_code, r.json()["decision"]) == (200, "forwarded"), r.text
    assert len(app.publisher.published) == 1 and app.recorder.decisions == [Decision.FORWARDED]


async def test_a_valid_token_passes(app: App) -> None:
    r = await app.push(envelope({"game_date": "2025-01-10"}), app.token())
    assert (r.status_code, r.json()["decision"]) == (200, "forwarded")
    r = await app.push(envelope({"game_date": "2025-01-10"}, "m2"), app.token())
    assert (r.status_code, r.json()["decision"]) == (200, "suppressed")


async def test_a_bad_token_on_an_unknown_route_is_401_not_404(app: App) -> None:
    r = await app.push(envelope({"game_date": "d"}), app.token(aud="https://else"), route="no-such-route")
    assert r.status_code == 401 and app.recorder.records == []


async def test_a_bad_token_on_a_malformed_body_is_401_not_400(app: App) -> None:
    """The token is checked before the body is read: nothing about a stranger's body is recorded."""
    r = await app.push(b"{" + SECRET.encode(), app.token(aud="https://else"))
    assert r.status_code == 401 and app.recorder.records == []


# --- nothing secret in the logs --------------------------------------------------------


@pytest.fixture(params=["json", "console"])
def log_output(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """Everything logsetup writes, at debug level, in `fmt`; the previous structlog set-up restored after."""
    for name in ("LOG_FORMAT", "LOG_LEVEL"):
        monkeypatch.delenv(name, raising=False)
    out = io.StringIO()
    out.fmt = request.param  # type: ignore[attr-defined]
    with logs_into(out, "debug", request.param, reset=True):
        yield out


def base64_forms(secret: bytes) -> set[str]:
    """The text `secret` becomes inside base64 at any of the three alignments, standard and URL-safe."""
    forms = set()
    for pad in range(3):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            forms.add(encode(b"\0" * pad + secret).decode()[4:-4])  # the characters only `secret` determines
    return forms


@pytest.mark.loop_may_block("it generates an RSA key and signs tokens in its body, between requests")
async def test_no_token_and_no_payload_content_is_ever_logged(
    app: App,
    log_output: io.StringIO,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    caplog.set_level(logging.DEBUG)
    tokens: list[str] = []
    sent: list[bytes] = []

    async def push(body: bytes, token: str | None = None, route: str = "reports") -> httpx.Response:
        if token:
            tokens.append(token)
        sent.append(body)
        return await app.push(body, token, route)

    good = app.token()
    json_secret = {"game_date": "2025-01-10", "notes": SECRET, "nested": {"k": [SECRET]}}
    raw_secret = b"\x89PNG\r\n\x1a\n" + SECRET.encode() + b"\xff\xfe"

    # accepted: forwarded, duplicate, suppressed, changed; JSON and raw payloads
    assert (await push(envelope(json_secret, "a1"), good)).json()["decision"] == "forwarded"
    assert (await push(envelope(json_secret, "a1"), good)).json()["decision"] == "duplicate"
    assert (await push(envelope(json_secret, "a2"), good)).json()["decision"] == "suppressed"
    changed = {**json_secret, "notes": SECRET + "-2"}
    assert (await push(envelope(changed, "a3"), good)).json()["decision"] == "forwarded"
    raw = envelope(raw_secret, "r1", attributes={"id": "raw-1"})
    assert (await push(raw, good, route="raw")).json()["decision"] == "forwarded"

    # forwarded fail-open (on_missing_key: forward): payloads that carry the secret but not the route's key
    for payload in (
        raw_secret,  # not JSON, on a route keyed by a payload field
        {"notes": SECRET},  # key field missing
        {"game_date": {"s": SECRET}},  # key field an object
        {"game_date": [SECRET]},  # key field a list
    ):
        r = await push(envelope(payload, "b1"), good)
        assert (r.status_code, r.json()["decision"]) == (200, "fail_open"), r.text

    # rejected: bodies that carry the secret but are no envelope
    secret_b64 = base64.b64encode(SECRET.encode()).decode()
    for body in (
        b"{" + SECRET.encode(),
        SECRET.encode(),
        json.dumps({"message": SECRET}).encode(),
        json.dumps({"message": {"messageId": "c1", "data": SECRET + "!!"}}).encode(),
        json.dumps({"message": {"messageId": "c2", "data": [SECRET]}}).encode(),
        json.dumps({"message": {"messageId": "c3", "data": secret_b64 + "*"}}).encode(),
        json.dumps({"message": {"messageId": "c4", "attributes": {"id": [SECRET]}, "data": secret_b64}}).encode(),
        json.dumps({"message": {"data": secret_b64}}).encode(),  # no message id
        json.dumps({"message": {"messageId": "c5", "data": secret_b64}, "deliveryAttempt": SECRET}).encode(),
        b'{"message": {"messageId": "c7", "data": "' + secret_b64.encode() + b'"}, "x": ' + b"[" * 5000 + b"}",
        envelope({"game_date": "d", "s": SECRET * 1000}, "c8"),  # over max_body: 413
    ):
        r = await push(body, good)
        assert r.status_code in (400, 413) and r.json()["decision"] == "rejected", r.text
    # an envelope with a field of its own is an envelope: its payload (not JSON) has no key, so fail-open
    unknown_field = json.dumps({"message": {"messageId": "c6", "data": secret_b64}, SECRET: "[" * 5000}).encode()
    r = await push(unknown_field, good)
    assert (r.status_code, r.json()["decision"]) == (200, "fail_open"), r.text

    # auth failures whose token carries the mark
    google = app.google
    bad = [
        app.token(aud="https://someone-else.run.app"),
        app.token(email="intruder@p.iam.gserviceaccount.com"),
        app.token(email_verified=False),
        app.token(issued_at=time.time() - 7200, lifetime=3600),
        app.token(iss="https://evil.example.com"),
        google.forge(claims()),
        unsigned(google, claims()),
        unsigned(google, claims(), alg="HS256"),
        tampered(good, **claims(email="intruder@p.iam.gserviceaccount.com")),
        f"{TOKEN_MARK}.{TOKEN_MARK}.{TOKEN_MARK}",
        TOKEN_MARK,
    ]
    for token in bad:
        r = await push(envelope(json_secret, "d1"), token)
        assert r.status_code in (401, 403), r.text
    # a key id nobody published, while Google's endpoint is down: the fetch failure is logged (stdlib),
    # and the answer is our outage (503, Pub/Sub retries), not the caller refused
    google.status = 503
    try:
        stranger = SigningKey.generate(kid=f"kid-{TOKEN_MARK}").sign(claims())
        assert (await push(envelope(json_secret, "d2"), stranger)).status_code == 503
    finally:
        google.status = 200
    r = await app.client.post(
        "/push/reports", content=envelope(json_secret, "d3"), headers={"Authorization": f"Basic {TOKEN_MARK}"}
    )
    assert r.status_code == 401

    # everything logged, whoever logged it: logsetup's stream, stdlib records, stdout and stderr
    captured = capsys.readouterr()
    text = "\n".join(
        [
            log_output.getvalue(),
            caplog.text,
            *(r.getMessage() for r in caplog.records),
            captured.out,
            captured.err,
        ]
    )
    needles = {SECRET, TOKEN_MARK, *base64_forms(SECRET.encode()), *base64_forms(TOKEN_MARK.encode())}
    for token in tokens:
        needles.add(token)
        needles.update(segment for segment in token.split(".") if len(segment) >= 8)
    for body in sent:  # the base64 `data` of every envelope sent, whole
        try:
            data = json.loads(body)["message"]["data"]
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        if isinstance(data, str) and len(data) >= 8:
            needles.add(data)
    leaked = sorted(n for n in needles if n in text)
    assert not leaked, f"logged: {leaked[:5]}"

    # and the logs are not empty: the decisions and the refusals are all there
    lines = log_output.getvalue()
    assert lines.count("push_unauthorized") == len(bad) + 1, lines
    assert lines.count("push_auth_unavailable") == 1, lines
    if log_output.fmt == "json":  # type: ignore[attr-defined]
        events = [json.loads(line) for line in lines.splitlines()]
        decisions = [e["decision"] for e in events if e["message"] == "decision"]
        for decision in ("forwarded", "duplicate", "suppressed", "rejected"):
            assert decision in decisions, decisions
        assert all(e["severity"] in ("DEBUG", "INFO", "WARNING", "ERROR") for e in events)
    else:
        for word in ("decision", "forwarded", "duplicate", "suppressed", "rejected"):
            assert word in lines
    assert "cannot fetch Google certificates" in text  # the stdlib warning was captured too
