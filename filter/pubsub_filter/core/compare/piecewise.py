"""A large JSON document decoded in pieces: the same value as one `decode`, in C calls of a few
hundred kilobytes each.

Under the in-process API a large message is decoded on a thread of its own
(`pubsub_filter.core.engine.offload`), but one C call holds Python's GIL for as long as it
runs, and the event loop's thread waits for it: msgspec's decode
of 8 MB of rows is one call of ~40 ms (more on a busy machine). In pieces, the thread gives the
GIL back between them. Only an object's arrays are cut (where the rows of a payload are); the
pieces keep the depth they had in the document (an element is decoded inside an object and an
array, as it sits), so the depth limit cuts where it would. Anything this does not vouch for (a
document that is not an object, a piece that does not decode) returns None, and the caller
decodes the whole document, which gives the value, or the error, it always gave.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pubsub_filter.core.compare.canonical import DECODE_ERRORS

#: Documents from this size on are decoded in pieces (`pubsub_filter.core.engine.offload.OFF_LOOP_BYTES`).
PIECEWISE_BYTES = 256 * 1024
#: About how many bytes of array elements one piece decodes.
PIECE = 256 * 1024

_object = msgspec.json.Decoder(dict[str, msgspec.Raw])
_array = msgspec.json.Decoder(list[msgspec.Raw])


def decode_in_pieces(decoder: msgspec.json.Decoder[Any], data: bytes) -> dict[str, Any] | None:
    """`decoder.decode(data)` for an object document, its large arrays in pieces; None when the
    document is not an object or any piece fails (decode it whole)."""
    try:
        top = _object.decode(data)
        return {name: _value(decoder, raw) for name, raw in top.items()}
    except DECODE_ERRORS:
        return None


def _value(decoder: msgspec.json.Decoder[Any], raw: msgspec.Raw) -> Any:
    view = memoryview(raw)
    if len(view) < PIECE or view[0] != ord("["):
        return decoder.decode(b'{"":' + view + b"}")[""]  # at its own depth: inside the object
    out: list[Any] = []
    piece: list[msgspec.Raw] = []
    size = 0
    for element in _array.decode(view):
        piece.append(element)
        size += len(element)
        if size >= PIECE:
            out.extend(decoder.decode(b'{"":[' + b",".join(piece) + b"]}")[""])
            piece, size = [], 0
    if piece:
        out.extend(decoder.decode(b'{"":[' + b",".join(piece) + b"]}")[""])
    return out
