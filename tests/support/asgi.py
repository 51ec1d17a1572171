"""One HTTP request to an ASGI app, called as uvicorn calls it (the whole body already
received), without a client library in between: fast enough for tens of thousands of requests."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Message = dict[str, Any]


async def call(
    app: Any,
    method: str,
    path: str,
    body: bytes = b"",
    headers: Sequence[tuple[bytes, bytes]] = (),
    chunks: Sequence[bytes] | None = None,
) -> tuple[int, bytes]:
    """(status, body) of one request; `headers` are sent after host and content-length (unless it is named).

    `chunks`: the body in several `http.request` messages (as a chunked upload arrives), in place of `body`."""
    sent: list[Message] = []
    parts = list(chunks) if chunks is not None else [body]
    body = b"".join(parts)

    async def receive() -> Message:
        if not parts:
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}

    async def send(message: Message) -> None:
        sent.append(message)

    base = [(b"host", b"filter")]
    if not any(name == b"content-length" for name, _ in headers):
        base.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [*base, *headers],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8080),
    }
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])
