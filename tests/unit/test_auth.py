from __future__ import annotations

import asyncio
import base64
import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

import pubsub_filter.push.auth as auth_module
from pubsub_filter.backends.stores.sqlite import SqliteStore
from pubsub_filter.core.config.schema import parse
from pubsub_filter.core.engine.engine import Engine
from pubsub_filter.core.envelope import make_envelope
from pubsub_filter.push.app import create_app
from pubsub_filter.push.auth import AuthError, CertsUnavailable, Principal, PushAuthenticator
from tests.support.fakes import MemoryPublisher, MemoryRecorder
from tests.support.oidc import LocalGoogleCerts, SigningKey, google_claims

#: Its bodies generate RSA keys (~0.1 s each, on the loop's thread) and call the authenticator
#: directly: no requests are served here.
pytestmark = pytest.mark.loop_may_block("test bodies generate RSA keys; nothing is served")

AUD = "https://filter.example.run.app/push"
SA = "pusher@example-project.iam.gserviceaccount.com"


@pytest.fixture
def google() -> Iterator[LocalGoogleCerts]:
    with LocalGoogleCerts() as server:
        yield server


@pytest.fixture
def auth(google: LocalGoogleCerts) -> PushAuthenticator:
    return PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(auth_module, "monotonic", fake)
    return fake


def bearer(token: str) -> str:
    return f"Bearer {token}"


def valid(google: LocalGoogleCerts, **overrides: Any) -> str:
    return google.sign(google_claims(**{"audience": AUD, "email": SA, **overrides}))


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


async def rejection(auth: PushAuthenticator, authorization: str | None) -> AuthError:
    with pytest.raises(AuthError) as caught:
        await auth.verify(authorization)
    return caught.value


# --- accepted -------------------------------------------------------------------------


async def test_valid_token_is_accepted(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    principal = await auth.verify(bearer(valid(google)))
    assert principal == Principal(email=SA, subject="112233445566778899000", audience=AUD)


async def test_bearer_scheme_is_case_insensitive(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    assert (await auth.verify(f"bearer {valid(google)}")).email == SA


async def test_short_form_issuer_is_accepted(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    assert (await auth.verify(bearer(valid(google, iss="accounts.google.com")))).email == SA


async def test_any_verified_email_is_accepted_without_service_account(google: LocalGoogleCerts) -> None:
    auth = PushAuthenticator(audience=AUD, service_account=None, certs_url=google.url)
    token = google.sign(google_claims(audience=AUD, email="someone@example.com"))
    assert (await auth.verify(bearer(token))).email == "someone@example.com"


async def test_expiry_within_clock_skew_is_accepted(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    token = valid(google, issued_at=time.time() - 3605, lifetime=3600)
    assert (await auth.verify(bearer(token))).email == SA


# --- 401: not a usable token ----------------------------------------------------------


@pytest.mark.parametrize("header", [None, ""])
async def test_missing_header_is_401(auth: PushAuthenticator, header: str | None) -> None:
    assert (await rejection(auth, header)).status == 401


@pytest.mark.parametrize("scheme", ["Basic", "Token", ""])
async def test_non_bearer_scheme_is_401(auth: PushAuthenticator, google: LocalGoogleCerts, scheme: str) -> None:
    assert (await rejection(auth, f"{scheme} {valid(google)}".strip())).status == 401


async def test_bearer_without_token_is_401(auth: PushAuthenticator) -> None:
    assert (await rejection(auth, "Bearer   ")).status == 401


@pytest.mark.parametrize(
    "token",
    [
        "garbage",
        "a.b",
        "a.b.c",
        "...",
        b64(b"[1, 2]") + ".e30.c2ln",
        b64(b'{"alg": "RS256", "kid": "k"}') + ".!!!.###",
        b64(b'{"alg": "RS256", "kid": "k"}') + "." + b64(b"[]") + ".c2ln",
    ],
)
async def test_garbage_token_is_401(auth: PushAuthenticator, token: str) -> None:
    assert (await rejection(auth, bearer(token))).status == 401


async def test_garbage_token_with_a_known_kid_is_401(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    header = b64(json.dumps({"alg": "RS256", "kid": google.kid}).encode())
    for token in (f"{header}.e30.c2ln", f"{header}.{b64(b'[]')}.c2ln", f"{header}.!!.!!"):
        assert (await rejection(auth, bearer(token))).status == 401


async def test_token_signed_by_another_key_is_401(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    forged = google.forge(google_claims(audience=AUD, email=SA))
    assert (await rejection(auth, bearer(forged))).status == 401


@pytest.mark.parametrize("alg", ["none", "HS256", "ES256"])
async def test_token_not_signed_with_rs256_is_401(auth: PushAuthenticator, google: LocalGoogleCerts, alg: str) -> None:
    _, payload, signature = valid(google).split(".")
    header = b64(json.dumps({"alg": alg, "kid": google.kid, "typ": "JWT"}).encode())
    for sig in ("", signature):
        assert (await rejection(auth, bearer(f"{header}.{payload}.{sig}"))).status == 401


async def test_expired_token_is_401(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    token = valid(google, issued_at=time.time() - 7200, lifetime=3600)
    assert (await rejection(auth, bearer(token))).status == 401


async def test_token_issued_in_the_future_is_401(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    token = valid(google, issued_at=time.time() + 600)
    assert (await rejection(auth, bearer(token))).status == 401


async def test_token_not_valid_before_a_future_nbf_is_401(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    token = valid(google, nbf=int(time.time()) + 600)
    assert (await rejection(auth, bearer(token))).status == 401


async def test_token_without_exp_is_401(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    assert (await rejection(auth, bearer(valid(google, exp=None)))).status == 401


async def test_wrong_audience_is_401(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    error = await rejection(auth, bearer(valid(google, aud="https://elsewhere.example/push")))
    assert (error.status, error.reason) == (401, "token has the wrong audience")


async def test_wrong_issuer_is_401(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    error = await rejection(auth, bearer(valid(google, iss="https://evil.example")))
    assert (error.status, error.reason) == (401, "token has the wrong issuer")


# --- 403: a genuine Google token, but not for us ----------------------------------------


async def test_wrong_email_is_403(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    token = valid(google, email="other@example-project.iam.gserviceaccount.com")
    assert (await rejection(auth, bearer(token))).status == 403


async def test_missing_email_is_403(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    assert (await rejection(auth, bearer(valid(google, email=None)))).status == 403


@pytest.mark.parametrize("verified", [False, "true", None])
async def test_email_not_verified_is_403(auth: PushAuthenticator, google: LocalGoogleCerts, verified: object) -> None:
    assert (await rejection(auth, bearer(valid(google, email_verified=verified)))).status == 403


# --- the certificate cache --------------------------------------------------------------


async def test_certs_are_fetched_once_for_many_verifies(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    token = valid(google)
    for _ in range(50):
        await auth.verify(bearer(token))
    assert google.requests == 1


async def test_concurrent_verifies_share_one_fetch(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    google.delay = 0.2
    token = valid(google)
    principals = await asyncio.gather(*(auth.verify(bearer(token)) for _ in range(20)))
    assert {p.email for p in principals} == {SA}
    assert google.requests == 1


async def test_verify_with_cached_certs_does_no_io(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    token = valid(google)
    await auth.verify(bearer(token))
    google.stop()
    assert (await auth.verify(bearer(token))).email == SA


async def test_certs_are_refetched_when_max_age_expires(google: LocalGoogleCerts, clock: FakeClock) -> None:
    google.max_age = 600
    auth = PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url)
    token = valid(google)
    await auth.verify(bearer(token))
    clock.now += 599
    await auth.verify(bearer(token))
    assert google.requests == 1
    clock.now += 2
    await auth.verify(bearer(token))
    assert google.requests == 2


async def test_certs_are_kept_an_hour_without_cache_control(google: LocalGoogleCerts, clock: FakeClock) -> None:
    google.max_age = None
    auth = PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url)
    token = valid(google)
    await auth.verify(bearer(token))
    clock.now += 3599
    await auth.verify(bearer(token))
    assert google.requests == 1
    clock.now += 2
    await auth.verify(bearer(token))
    assert google.requests == 2


async def test_unknown_kid_triggers_one_refetch(
    auth: PushAuthenticator, google: LocalGoogleCerts, clock: FakeClock
) -> None:
    await auth.verify(bearer(valid(google)))
    google.rotate()
    rotated = valid(google)
    assert (await auth.verify(bearer(rotated))).email == SA
    assert (await auth.verify(bearer(rotated))).email == SA
    assert google.requests == 2


async def test_unknown_kid_refetches_at_most_once_per_30s(
    auth: PushAuthenticator, google: LocalGoogleCerts, clock: FakeClock
) -> None:
    await auth.verify(bearer(valid(google)))
    claims = google_claims(audience=AUD, email=SA)
    for _ in range(5):
        stranger = (await asyncio.to_thread(SigningKey.generate)).sign(claims)  # RSA keygen: off the loop
        assert (await rejection(auth, bearer(stranger))).status == 401
    assert google.requests == 2
    clock.now += 31
    google.rotate()
    assert (await auth.verify(bearer(valid(google)))).email == SA
    assert google.requests == 3


async def test_concurrent_unknown_kids_wait_for_the_refetch_under_way(
    auth: PushAuthenticator, google: LocalGoogleCerts
) -> None:
    await auth.verify(bearer(valid(google)))
    google.rotate()
    google.delay = 0.2
    rotated = valid(google)
    principals = await asyncio.gather(*(auth.verify(bearer(rotated)) for _ in range(10)))
    assert {p.email for p in principals} == {SA}
    assert google.requests == 2


async def test_injected_fetch_is_used(google: LocalGoogleCerts) -> None:
    urls: list[str] = []

    def fetch(url: str) -> tuple[Mapping[str, str], float | None]:
        urls.append(url)
        return google.document(), None

    auth = PushAuthenticator(audience=AUD, service_account=SA, certs_url="https://certs.test/v1", fetch=fetch)
    assert (await auth.verify(bearer(valid(google)))).email == SA
    assert urls == ["https://certs.test/v1"]
    assert google.requests == 0


# --- the certs endpoint failing ----------------------------------------------------------


def _refused(google: LocalGoogleCerts) -> PushAuthenticator:
    google.stop()
    return PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url)


def _http_503(google: LocalGoogleCerts) -> PushAuthenticator:
    google.status = 503
    return PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url)


def _not_a_certs_document(google: LocalGoogleCerts) -> PushAuthenticator:
    return PushAuthenticator(
        audience=AUD,
        service_account=SA,
        certs_url=google.url,
        fetch=lambda url: ([1, 2], None),  # type: ignore[arg-type,return-value]
    )


def _fetch_raises(google: LocalGoogleCerts) -> PushAuthenticator:
    def fetch(url: str) -> tuple[Mapping[str, str], float | None]:
        raise RuntimeError("boom")

    return PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url, fetch=fetch)


@pytest.mark.parametrize("down", [_refused, _http_503, _not_a_certs_document, _fetch_raises])
async def test_certs_endpoint_down_is_our_outage_503_not_the_callers_fault(
    google: LocalGoogleCerts, down: Callable[[LocalGoogleCerts], PushAuthenticator]
) -> None:
    token = valid(google)
    auth = down(google)
    error = await rejection(auth, bearer(token))
    assert isinstance(error, CertsUnavailable)
    assert (error.status, error.reason) == (503, "cannot fetch Google certificates")


async def test_certs_endpoint_recovering_is_picked_up(auth: PushAuthenticator, google: LocalGoogleCerts) -> None:
    token = valid(google)
    google.status = 503
    assert (await rejection(auth, bearer(token))).status == 503
    google.status = 200
    assert (await auth.verify(bearer(token))).email == SA


# --- the token never leaks ----------------------------------------------------------------

SECRET = secrets.token_hex(16)


def _garbage(google: LocalGoogleCerts) -> str:
    return f"not-a-jwt-{SECRET}"


def _two_segments(google: LocalGoogleCerts) -> str:
    return f"{SECRET}a.{SECRET}b"


def _bad_header(google: LocalGoogleCerts) -> str:
    return f"{b64(('{not json ' + SECRET).encode())}.{SECRET}.{SECRET}"


def _bad_payload(google: LocalGoogleCerts) -> str:
    header = b64(json.dumps({"alg": "RS256", "kid": google.kid}).encode())
    return f"{header}.{b64(('[' + SECRET).encode())}.{SECRET}"


def _forged(google: LocalGoogleCerts) -> str:
    return google.forge(google_claims(audience=AUD, email=SA))


def _expired(google: LocalGoogleCerts) -> str:
    return valid(google, issued_at=time.time() - 7200)


def _wrong_audience(google: LocalGoogleCerts) -> str:
    return valid(google, aud="https://elsewhere.example/push")


def _wrong_email(google: LocalGoogleCerts) -> str:
    return valid(google, email="other@example.com")


def _unknown_kid_endpoint_down(google: LocalGoogleCerts) -> str:
    google.status = 500
    return SigningKey.generate().sign(google_claims(audience=AUD, email=SA))


@pytest.mark.parametrize(
    "make_token",
    [
        _garbage,
        _two_segments,
        _bad_header,
        _bad_payload,
        _forged,
        _expired,
        _wrong_audience,
        _wrong_email,
        _unknown_kid_endpoint_down,
    ],
)
async def test_reason_and_logs_never_contain_the_token(
    auth: PushAuthenticator,
    google: LocalGoogleCerts,
    caplog: pytest.LogCaptureFixture,
    make_token: Callable[[LocalGoogleCerts], str],
) -> None:
    caplog.set_level(logging.DEBUG)
    token = make_token(google)
    error = await rejection(auth, bearer(token))
    # No chained exception either: google-auth's own messages quote the token.
    assert error.__cause__ is None and error.__context__ is None
    parts = [token, SECRET, *(p for p in token.split(".") if len(p) >= 8)]
    for text in (error.reason, str(error), repr(error), caplog.text):
        for part in parts:
            assert part not in text


# --- through the push endpoint: an outage of ours is 503, not an unauthorized caller ---------------


async def push_with(auth: PushAuthenticator, token: str, tmp_path: Path) -> tuple[httpx.Response, Counter[str]]:
    """The answer to one push, and what the engine behind it counted."""
    config = parse({"routes": [{"name": "reports", "destination": "phase3", "key": ["payload.game_date"]}]})
    engine = Engine(config, SqliteStore(tmp_path / "state.db"), MemoryPublisher(), MemoryRecorder())
    transport = httpx.ASGITransport(app=create_app(engine, auth))
    async with httpx.AsyncClient(transport=transport, base_url="http://filter") as client:
        body = make_envelope(b'{"game_date": "d1"}', "m1")
        return await client.post("/push/reports", content=body, headers={"Authorization": bearer(token)}), engine.counts


async def test_push_answers_503_with_retry_after_when_google_certificates_cannot_be_fetched(
    google: LocalGoogleCerts, tmp_path: Path
) -> None:
    token = valid(google)
    google.status = 503
    auth = PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url)
    response, counts = await push_with(auth, token, tmp_path)
    assert response.status_code == 503
    assert response.headers["Retry-After"].isdigit()
    assert response.json() == {"error": "cannot fetch Google certificates"}
    assert counts["auth_rejected"] == 0  # not counted as a caller refused


async def test_push_still_answers_401_and_counts_a_token_for_another_audience(
    google: LocalGoogleCerts, tmp_path: Path
) -> None:
    auth = PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url)
    response, counts = await push_with(auth, valid(google, aud="https://elsewhere.example/push"), tmp_path)
    assert response.status_code == 401
    assert counts == {"auth_rejected": 1}  # by the engine behind this app: no other test's count in it
