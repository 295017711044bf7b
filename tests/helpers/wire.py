"""Raw protobuf wire bytes for requests a generated client would refuse to build (invalid UTF-8, huge repeats)."""

from __future__ import annotations


def varint(n: int) -> bytes:
    """``n`` (>= 0) as a protobuf base-128 varint."""
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2) holding ``payload`` as it is."""
    return varint(number << 3 | 2) + varint(len(payload)) + payload
