"""A local stand-in for Google's OIDC certificate endpoint, and tokens signed to match it.

    with LocalGoogleCerts() as google:
        auth = PushAuthenticator(audience=AUD, service_account=SA, certs_url=google.url)
        token = google.sign(google_claims(audience=AUD, email=SA))
        headers = {"Authorization": f"Bearer {token}"}

The certs document is Google's v1 format, `{kid: PEM x509 certificate}`.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from google.auth import crypt, jwt

GOOGLE_ISSUER = "https://accounts.google.com"


def google_claims(
    *,
    audience: str,
    email: str,
    issuer: str = GOOGLE_ISSUER,
    lifetime: int = 3600,
    issued_at: float | None = None,
    **overrides: Any,
) -> dict[str, Any]:
    """The claims of a Pub/Sub push OIDC token; `overrides` replace or add any (None removes)."""
    iat = int(time.time() if issued_at is None else issued_at)
    claims: dict[str, Any] = {
        "iss": issuer,
        "aud": audience,
        "azp": "112233445566778899000",
        "sub": "112233445566778899000",
        "email": email,
        "email_verified": True,
        "iat": iat,
        "exp": iat + lifetime,
    }
    claims.update(overrides)
    return {k: v for k, v in claims.items() if v is not None}


@dataclass(frozen=True)
class SigningKey:
    kid: str
    private_pem: bytes
    cert_pem: str
    #: Made once from the key: loading a private key checks it (60 ms of CPU a token, on the loop of
    #: the test that signs one, if each signing loaded it again).
    signer: Any = field(compare=False, repr=False, default=None)

    @classmethod
    def generate(cls, kid: str | None = None) -> SigningKey:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "local-google-certs")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .sign(key, hashes.SHA256())
        )
        private_pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        kid = kid or secrets.token_hex(20)
        return cls(
            kid=kid,
            private_pem=private_pem,
            cert_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
            # google-auth ships these two without annotations.
            signer=crypt.RSASigner.from_string(private_pem, key_id=kid),  # type: ignore[no-untyped-call]
        )

    def sign(self, claims: Mapping[str, Any]) -> str:
        token: bytes = jwt.encode(self.signer, dict(claims))  # type: ignore[no-untyped-call]
        return token.decode()


class LocalGoogleCerts:
    """Serves `{kid: cert}` on 127.0.0.1 and signs tokens with the current key.

    `requests` counts the GETs served. Set `status` to make the endpoint answer with an
    error, `delay` to slow it down, `max_age` (None: no Cache-Control) before requests.
    """

    def __init__(self, *, max_age: int | None = 3600) -> None:
        self.max_age = max_age
        self.status = 200
        self.delay = 0.0
        self._keys = [SigningKey.generate()]
        self._requests = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._url: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """Stays set after stop(), where it refuses connections: an endpoint that is down."""
        assert self._url is not None, "call start() first"
        return self._url

    @property
    def requests(self) -> int:
        with self._lock:
            return self._requests

    @property
    def kid(self) -> str:
        return self._keys[-1].kid

    def sign(self, claims: Mapping[str, Any]) -> str:
        """A token signed by the current published key."""
        return self._keys[-1].sign(claims)

    def forge(self, claims: Mapping[str, Any]) -> str:
        """A token claiming the current kid but signed by a key that was never published."""
        return SigningKey.generate(kid=self.kid).sign(claims)

    def rotate(self, *, keep_old: bool = True) -> str:
        """Publish a new key and sign with it from now on, as Google does every few days."""
        new = SigningKey.generate()
        self._keys = [*self._keys, new] if keep_old else [new]
        return new.kid

    def document(self) -> dict[str, str]:
        return {k.kid: k.cert_pem for k in self._keys}

    def start(self) -> LocalGoogleCerts:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        host, port = self._server.server_address[:2]
        self._url = f"http://{host!s}:{port}/oauth2/v1/certs"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="local-google-certs"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> LocalGoogleCerts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        google = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with google._lock:
                    google._requests += 1
                if google.delay:
                    time.sleep(google.delay)
                if google.status != 200:
                    self.send_error(google.status)
                    return
                body = json.dumps(google.document()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(body)))
                if google.max_age is not None:
                    self.send_header("Cache-Control", f"public, max-age={google.max_age}, must-revalidate")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
