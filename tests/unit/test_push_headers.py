"""The push path reads its headers in one pass, and reads what Starlette's `Headers.get` reads."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.requests import Request

from pubsub_filter.push.app import headers_of, trace_of

NAMES = ["content-length", "x-cloud-trace-context", "traceparent"]
_RAW = st.lists(
    st.tuples(
        st.sampled_from([*NAMES, "host", "authorization", "content-type"]).map(str.encode),
        st.binary(max_size=40),
    ),
    max_size=8,
)


def request(raw: list[tuple[bytes, bytes]]) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/", "headers": raw})


@settings(max_examples=500, deadline=None)
@given(_RAW)
def test_each_header_read_is_the_one_starlette_reads(raw: list[tuple[bytes, bytes]]) -> None:
    req = request(raw)
    found = headers_of(req)
    assert [found.get(n.encode()) for n in NAMES] == [req.headers.get(n) for n in NAMES]


def test_the_first_of_a_repeated_header_is_the_one_read() -> None:
    found = headers_of(request([(b"traceparent", b"first"), (b"traceparent", b"second")]))
    assert found == {b"traceparent": "first"}


def test_the_cloud_trace_header_names_the_trace_before_traceparent() -> None:
    trace = "0af7651916cd43dd8448eb211c80319c"
    raw = [
        (b"traceparent", f"00-{'1' * 32}-b7ad6b7169203331-01".encode()),
        (b"x-cloud-trace-context", f"{trace}/1;o=1".encode()),
    ]
    assert trace_of(headers_of(request(raw))) == trace


def test_a_request_without_trace_headers_has_no_trace() -> None:
    assert trace_of(headers_of(request([(b"content-length", b"12")]))) is None
