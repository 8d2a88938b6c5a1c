"""The PNG codec: every filter type decoded, alpha composited over white, encode/decode round trip."""

import struct
import zlib

import pytest

from harness_env.families.svg_icon.pngcodec import PNG_SIGNATURE, PngError, decode_png, encode_png, paste_centered


def _filtered_png(width, height, pixels, channels, color_type, ftypes):
    """A PNG whose rows use the given filter types (cycled): exercises every reconstruction."""
    stride = width * channels
    rows = [pixels[y * stride : (y + 1) * stride] for y in range(height)]
    out = bytearray()
    prev = bytes(stride)
    for y, row in enumerate(rows):
        f = ftypes[y % len(ftypes)]
        enc = bytearray()
        for i, x in enumerate(row):
            a = row[i - channels] if i >= channels else 0
            b = prev[i]
            c = prev[i - channels] if i >= channels else 0
            if f == 0:
                pred = 0
            elif f == 1:
                pred = a
            elif f == 2:
                pred = b
            elif f == 3:
                pred = (a + b) // 2
            else:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
            enc.append((x - pred) & 0xFF)
        out += bytes([f]) + enc
        prev = row

    def chunk(t, body):
        return struct.pack(">I", len(body)) + t + body + struct.pack(">I", zlib.crc32(t + body))

    return (
        PNG_SIGNATURE
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, color_type, 0, 0, 0))
        + chunk(b"IDAT", zlib.compress(bytes(out)))
        + chunk(b"IEND", b"")
    )


def test_decode_every_filter_rgb():
    w, h = 7, 10
    px = bytes((x * 37 + y * 11 + c * 91) % 256 for y in range(h) for x in range(w) for c in range(3))
    png = _filtered_png(w, h, px, 3, 2, [0, 1, 2, 3, 4])
    assert decode_png(png) == (w, h, px)


def test_decode_rgba_composites_over_white():
    px = bytes([255, 0, 0, 255, 0, 0, 255, 0, 0, 0, 0, 128])  # red opaque, blue clear, black half
    png = _filtered_png(3, 1, px, 4, 6, [4])
    assert decode_png(png) == (3, 1, bytes([255, 0, 0, 255, 255, 255, 127, 127, 127]))


def test_encode_roundtrip_and_bad_input():
    px = bytes(range(256)) * 3
    assert decode_png(encode_png(16, 16, px)) == (16, 16, px)
    with pytest.raises(PngError):
        decode_png(b"not a png")


def test_paste_centered():
    small = encode_png(2, 1, b"\x00\x00\x00" * 2)
    w, h, px = decode_png(paste_centered(4, 3, small))
    assert (w, h) == (4, 3)
    black = [i for i in range(12) if px[3 * i : 3 * i + 3] == b"\0\0\0"]
    assert black == [5, 6]  # row 1, columns 1-2
