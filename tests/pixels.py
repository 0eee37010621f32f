"""The pixels of a PNG that Chromium took (Playwright's `screenshot()`), for tests that must
look at what was drawn, not at the markup: 8-bit RGB or RGBA, not interlaced, which is what
Chromium writes. No imaging library: zlib and the five PNG row filters are enough."""

from __future__ import annotations

import struct
import zlib
from collections import Counter

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode(png: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """(width, height, RGB pixels row by row); alpha, if any, is dropped (screenshots are opaque)."""
    assert png.startswith(_SIGNATURE), "not a PNG"
    pos, data, header = len(_SIGNATURE), b"", None
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        chunk = png[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            data += chunk
        elif kind == b"IEND":
            break
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, f"unsupported PNG: {header}"
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(data)
    stride = width * channels
    pixels: list[tuple[int, int, int]] = []
    previous = bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, row = raw[start], bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            left = row[i - channels] if i >= channels else 0
            up = previous[i]
            upper_left = previous[i - channels] if i >= channels else 0
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                row[i] = (row[i] + _paeth(left, up, upper_left)) & 0xFF
        pixels += [tuple(row[x:x + 3]) for x in range(0, stride, channels)]
        previous = row
    return width, height, pixels


def most_common(pixels: list[tuple[int, int, int]]) -> tuple[tuple[int, int, int], float]:
    """The most frequent colour and its share of the pixels."""
    colour, n = Counter(pixels).most_common(1)[0]
    return colour, n / len(pixels)


def share(pixels: list[tuple[int, int, int]], test) -> float:
    return sum(1 for p in pixels if test(p)) / len(pixels)


def rgb(css: str) -> tuple[int, int, int]:
    """'rgb(26, 32, 41)' (a computed colour) -> (26, 32, 41)."""
    inside = css[css.index("(") + 1:css.index(")")]
    r, g, b = (int(float(v)) for v in inside.replace("/", ",").split(",")[:3])
    return r, g, b
