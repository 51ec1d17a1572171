"""Verify the Google-signed OIDC token that Pub/Sub attaches to each push request.

Google's public certificates are cached for their `Cache-Control: max-age`, so a token
signed with a known key is checked without any I/O. Nothing here logs or returns the
token: google-auth quotes it in some of its error messages, so those never leave this module.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import monotonic
from typing import Any

import requests
from google.auth import exceptions as google_exceptions
from google.auth import jwt

from pubsub_filter.core.errors import FilterError
from pubsub_filter.core.numerals import bounded_int

log = logging.getLogger(__name__)

GOOGLE_ISSUERS = ("https://accounts.google.com", "accounts.google.com")
GOOGLE_CERTS_URL = "https://www.googleapis.com/oauth2/v1/certs"

#: Blocking: GET the certs URL and return ({kid: PEM certificate}, max-age in seconds or None).
FetchCerts = Callable[[str], tuple[Mapping[str, str], float | None]]

_DEFAULT_MAX_AGE = 3600.0
# Junk kids are free to mint; without a floor each one would cost a fetch from Google.
_KID_REFETCH_INTERVAL = 30.0
_FETCH_TIMEOUT = 10.0
_CANNOT_FETCH = "cannot fetch Google certificates"


class AuthError(FilterError):
    """A push request that must not be processed: 401 (who are you?), 403 (not you), or 503
    (`CertsUnavailable`: we cannot tell now)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


class CertsUnavailable(AuthError):
    """Google's certificates could not be fetched, so no token can be checked: our outage, not
    the caller's fault. 503 with Retry-After: Pub/Sub sends the message again."""

    def __init__(self) -> None:
        super().__init__(503, _CANNOT_FETCH)


@dataclass(frozen=True)
class Principal:
    email: str
    subject: str
    audience: str


def fetch_google_certs(url: str) -> tuple[Mapping[str, str], float | None]:
    response = requests.get(url, timeout=_FETCH_TIMEOUT)
    response.raise_for_status()
    return response.json(), _max_age(response.headers)


def _max_age(headers: Mapping[str, str]) -> float | None:
    m = re.search(r"max-age=(\d+)", headers.get("Cache-Control", ""))
    max_age = bounded_int(m.group(1), 12) if m else None
    if max_age is None:
        return None
    # A proxy between us and Google may already have held the document for `Age` seconds.
    age = bounded_int(headers.get("Age", "0"), 12) or 0
    return float(max(0, max_age - age))


class PushAuthenticator:
    def __init__(
        self,
        *,
        audience: str,
        service_account: str | None,
        issuers: tuple[str, ...] = GOOGLE_ISSUERS,
        certs_url: str = GOOGLE_CERTS_URL,
        clock_skew: int = 10,
        fetch: FetchCerts | None = None,
    ) -> None:
        self._audience = audience
        self._service_account = service_account.lower() if service_account else None
        self._issuers = issuers
        self._certs_url = certs_url
        self._skew = clock_skew
        self._fetch = fetch or fetch_google_certs
        self._certs: Mapping[str, str] = {}
        self._expires_at = float("-inf")
        self._last_kid_refetch = float("-inf")
        self._inflight: asyncio.Task[bool] | None = None

    async def verify(self, authorization: str | None) -> Principal:
        token = _bearer_token(authorization)
        kid = _key_id(token)
        certs = await self._certs_for(kid)
        if kid not in certs:
            raise AuthError(401, "token signed by an unknown key")
        return self._principal(_decode(token, certs, self._skew))

    def _principal(self, claims: Mapping[str, Any]) -> Principal:
        if claims.get("iss") not in self._issuers:
            raise AuthError(401, "token has the wrong issuer")
        if claims.get("aud") != self._audience:
            raise AuthError(401, "token has the wrong audience")
        nbf = claims.get("nbf", 0)
        if not isinstance(nbf, int | float) or nbf > time.time() + self._skew:
            raise AuthError(401, "token is not valid yet")
        email = claims.get("email")
        if not isinstance(email, str) or not email:
            raise AuthError(403, "token carries no email")
        if self._service_account is not None and email.lower() != self._service_account:
            raise AuthError(403, "token is for a different service account")
        if claims.get("email_verified") is not True:
            raise AuthError(403, "token email is not verified")
        return Principal(email=email, subject=str(claims.get("sub", "")), audience=self._audience)

    async def _certs_for(self, kid: str) -> Mapping[str, str]:
        now = monotonic()
        stale = now >= self._expires_at
        missing = kid not in self._certs
        # Google publishes a key before signing with it, so a miss usually means our copy
        # predates a rotation.
        if missing and not stale and now - self._last_kid_refetch >= _KID_REFETCH_INTERVAL:
            self._last_kid_refetch = now
            stale = True
        # A fetch already under way may be the one bringing this kid, even when rate-limited.
        if stale or (missing and self._inflight is not None):
            await self._refresh()
        return self._certs

    async def _refresh(self) -> None:
        if self._inflight is None:
            self._inflight = asyncio.create_task(self._fetch_certs())
        # Shielded: one client hanging up must not cancel the fetch other requests wait on.
        if not await asyncio.shield(self._inflight):
            raise CertsUnavailable

    async def _fetch_certs(self) -> bool:
        try:
            certs, max_age = await asyncio.to_thread(self._fetch, self._certs_url)
            if not isinstance(certs, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in certs.items()
            ):
                raise ValueError("the certificates document is not a {kid: PEM} object")
            self._certs = dict(certs)
            self._expires_at = monotonic() + (_DEFAULT_MAX_AGE if max_age is None else max_age)
            return True
        except Exception as exc:
            log.warning("%s from %s: %s", _CANNOT_FETCH, self._certs_url, exc)
            return False
        finally:
            self._inflight = None


def _bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise AuthError(401, "missing Authorization header")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError(401, "Authorization is not a Bearer token")
    return token.strip()


def _key_id(token: str) -> str:
    # Parsed here rather than with jwt.decode_header, whose errors quote the token.
    try:
        segment = token.split(".")[0]
        header = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except Exception:
        header = None
    if not isinstance(header, dict) or token.count(".") != 2:
        raise AuthError(401, "malformed token")
    # Pinned so a token cannot pick a weaker algorithm than the RSA keys Google publishes.
    if header.get("alg") != "RS256":
        raise AuthError(401, "token is not signed with RS256")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise AuthError(401, "token has no key id")
    return kid


def _decode(token: str, certs: Mapping[str, str], skew: int) -> Mapping[str, Any]:
    reason = "token signature or format is invalid"
    try:
        # The audience is compared in _principal instead, so a misconfigured audience -
        # the usual push-subscription mistake - gets a reason of its own.
        claims: Mapping[str, Any] = jwt.decode(  # type: ignore[no-untyped-call]
            token, certs=certs, audience=None, clock_skew_in_seconds=skew
        )
        return claims
    except google_exceptions.InvalidValue:
        # With the algorithm pinned, decode raises this only after the signature checked out.
        reason = "token is expired or not valid yet"
    except Exception:
        pass  # attacker-controlled input: whatever fails to parse is a 401, never a 500
    # Raised outside the handlers so no exception context carries google-auth's message.
    raise AuthError(401, reason)
