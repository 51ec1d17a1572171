"""Reading `filter_fence` from a forward's attributes: a fence the filter writes, or a FenceError.

The filter writes a lease token, 1..2^63-1 (a signed 64-bit integer, what every fence store
keeps). Anything else in the attribute is not the filter's, and is refused as such, never as
an OverflowError from a store or CPython's ValueError for an integer string past its digit limit.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pubsub_filter.consumer.fence import FenceError, identity_of

ROUTE_AND_KEY = {"filter_route": "reports", "filter_key": "g1"}


def fence_of(raw: str) -> int:
    found = identity_of({**ROUTE_AND_KEY, "filter_fence": raw})
    assert found is not None
    return found[1]


@pytest.mark.parametrize(
    "raw",
    ["0", "00", str(2**63), str(2**64), "9" * 4301, "1" * 100_000, "01", "+1", " 1", "1_000", "\u0661"],
)
def test_a_string_outside_the_fences_the_filter_writes_is_a_fence_error(raw: str) -> None:
    with pytest.raises(FenceError, match="not a fence the filter writes"):
        fence_of(raw)


@pytest.mark.parametrize("fence", [1, 2, 10, 2**31, 2**63 - 1])
def test_every_fence_the_filter_writes_reads_back_as_itself(fence: int) -> None:
    assert fence_of(str(fence)) == fence


@settings(max_examples=2000)
@given(
    st.one_of(
        st.text(),
        st.text(alphabet="0123456789", max_size=30),
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
        st.integers(min_value=0, max_value=10_000).map(lambda n: "9" * n),
    )
)
def test_every_string_is_a_fence_in_range_or_a_fence_error(raw: str) -> None:
    try:
        fence = fence_of(raw)
    except FenceError:
        return
    assert 1 <= fence <= 2**63 - 1
    assert raw == str(fence)
