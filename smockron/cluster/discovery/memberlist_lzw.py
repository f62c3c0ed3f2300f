"""Go's compress/lzw reader (LSB order, 8-bit literals), which memberlist's
``decompressBuffer`` uses for compressed messages (``EnableCompression``). Pure bytes in
and out; a separate module because it is a codec of its own, not memberlist's format.
"""

from __future__ import annotations


class LzwError(ValueError):
    """Data that Go's reader would refuse, or that would expand past the caller's limit."""


_CLEAR, _EOF, _MAX_WIDTH = 256, 257, 12
_INVALID = 0xFFFF


def lzw_decode(data: bytes, limit: int) -> bytes:
    """compress/lzw ``NewReader(r, LSB, 8)`` as memberlist's ``decompressBuffer`` uses it."""
    suffix = bytearray(1 << _MAX_WIDTH)
    prefix = [0] * (1 << _MAX_WIDTH)
    out = bytearray()
    width, hi, overflow, last = 9, _EOF, 1 << 9, _INVALID
    bits = nbits = pos = 0
    while True:
        while nbits < width:
            if pos >= len(data):
                raise LzwError("lzw: unexpected end of data")
            bits |= data[pos] << nbits
            pos += 1
            nbits += 8
        code = bits & ((1 << width) - 1)
        bits >>= width
        nbits -= width
        if code == _CLEAR:
            width, hi, overflow, last = 9, _EOF, 1 << 9, _INVALID
            continue
        if code == _EOF:
            return bytes(out)
        head, entry = _lzw_entry(code, hi, last, prefix, suffix)
        out += entry
        if len(out) > limit:
            raise LzwError("decompressed message is larger than limit")
        if last != _INVALID:
            suffix[hi], prefix[hi] = head, last
        last, hi = code, hi + 1
        if hi >= overflow:
            if width == _MAX_WIDTH:
                last, hi = _INVALID, hi - 1
            else:
                width, overflow = width + 1, 1 << (width + 1)


def _lzw_entry(
    code: int, hi: int, last: int, prefix: list[int], suffix: bytearray
) -> tuple[int, bytes]:
    """The bytes ``code`` stands for and their first byte. ``code == hi`` is the code
    being defined by this very step: the last string plus that string's first byte."""
    if code < _CLEAR:
        return code, bytes([code])
    if code > hi:
        raise LzwError("lzw: invalid code")
    c, tail = code, b""
    if code == hi and last != _INVALID:
        c = last
        while c >= _CLEAR:
            c = prefix[c]
        tail, c = bytes([c]), last
    chain = bytearray()
    while c >= _CLEAR:
        chain.append(suffix[c])
        c = prefix[c]
    chain.append(c)
    chain.reverse()
    return c, bytes(chain) + tail
