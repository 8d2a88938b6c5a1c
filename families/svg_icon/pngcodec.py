"""A small PNG decoder and encoder: 8-bit, non-interlaced images (gray, RGB, palette, with or
without alpha), zlib and filter reconstruction in pure Python.

The one place that knows the PNG format (its signature included): grading reads the rendered
icon's pixels with it, the resvg renderer centres its output with it, and the dataset generator and
the judge recognise PNG files by `PNG_SIGNATURE`.

Standard library only, Python >= 3.11: its source is shipped into the sandbox beside the preview
helper (see preview.preview_files), which has the system `python3` and no venv.
"""

from __future__ import annotations

import struct
import zlib

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"  # the first 8 bytes of every PNG file
_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # colour type -> samples per pixel


class PngError(ValueError):
    pass


def _unfilter(raw: bytes, width: int, height: int, bpp: int) -> bytearray:
    stride = width * bpp
    if len(raw) < height * (stride + 1):
        raise PngError("truncated image data")
    out = bytearray(height * stride)
    prev = bytearray(stride)
    pos = 0
    for y in range(height):
        ftype = raw[pos]
        line = bytearray(raw[pos + 1 : pos + 1 + stride])
        pos += stride + 1
        if ftype == 0:
            pass
        elif ftype == 1:  # Sub
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:  # Up
            line = bytearray([(a + b) & 0xFF for a, b in zip(line, prev)])
        elif ftype == 3:  # Average
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:  # Paeth
            for i in range(stride):
                if i >= bpp:
                    a, c = line[i - bpp], prev[i - bpp]
                else:
                    a = c = 0
                b = prev[i]
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                if pa <= pb and pa <= pc:
                    pred = a
                elif pb <= pc:
                    pred = b
                else:
                    pred = c
                line[i] = (line[i] + pred) & 0xFF
        else:
            raise PngError(f"bad filter type {ftype} on row {y}")
        out[y * stride : (y + 1) * stride] = line
        prev = line
    return out


def decode_png(data: bytes) -> tuple[int, int, bytes]:
    """(width, height, pixels): pixels are RGB, 3 bytes each, row-major, with any alpha composited
    over white. 8-bit, non-interlaced PNGs (gray, RGB, palette, with or without alpha)."""
    if not data.startswith(PNG_SIGNATURE):
        raise PngError("not a PNG file")
    pos = len(PNG_SIGNATURE)
    header = None
    palette = b""
    trns = b""
    idat = []
    while pos + 8 <= len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if ctype == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif ctype == b"PLTE":
            palette = chunk
        elif ctype == b"tRNS":
            trns = chunk
        elif ctype == b"IDAT":
            idat.append(chunk)
        elif ctype == b"IEND":
            break
    if header is None:
        raise PngError("no IHDR chunk")
    width, height, depth, color_type, _, _, interlace = header
    if depth != 8 or interlace != 0 or color_type not in _CHANNELS:
        raise PngError(f"unsupported PNG: bit depth {depth}, colour type {color_type}, interlace {interlace}")
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as e:
        raise PngError(f"corrupt image data: {e}") from e
    n = _CHANNELS[color_type]
    px = _unfilter(raw, width, height, n)
    if color_type == 2:
        return width, height, bytes(px)
    if color_type == 0:
        return width, height, bytes(v for g in px for v in (g, g, g))
    if color_type == 3:
        lut = []
        for i in range(256):
            r, g, b = palette[3 * i : 3 * i + 3] or b"\0\0\0"
            a = trns[i] if i < len(trns) else 255
            lut.append(bytes(_over_white(c, a) for c in (r, g, b)))
        return width, height, b"".join(lut[i] for i in px)
    if color_type == 4:
        out = bytearray()
        for i in range(0, len(px), 2):
            v = _over_white(px[i], px[i + 1])
            out += bytes((v, v, v))
        return width, height, bytes(out)
    # RGBA
    if all(a == 255 for a in px[3::4]):
        rgb = bytearray(width * height * 3)
        rgb[0::3], rgb[1::3], rgb[2::3] = px[0::4], px[1::4], px[2::4]
        return width, height, bytes(rgb)
    out = bytearray(width * height * 3)
    for j, i in enumerate(range(0, len(px), 4)):
        a = px[i + 3]
        out[3 * j], out[3 * j + 1], out[3 * j + 2] = (_over_white(px[i + k], a) for k in range(3))
    return width, height, bytes(out)


def _over_white(c: int, a: int) -> int:
    return (c * a + 255 * (255 - a) + 127) // 255


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG (no filtering)."""
    stride = width * 3
    raw = b"".join(b"\0" + rgb[y * stride : (y + 1) * stride] for y in range(height))

    def chunk(ctype: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + ctype + body + struct.pack(">I", zlib.crc32(ctype + body) & 0xFFFFFFFF)

    return PNG_SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def paste_centered(width: int, height: int, png: bytes, background: tuple[int, int, int] = (255, 255, 255)) -> bytes:
    """`png` centred on a width x height canvas of `background` (how `object-fit: contain` places
    an image), as a new PNG. Used to bring resvg's fitted output to the fixed render size."""
    w, h, px = decode_png(png)
    if (w, h) == (width, height):
        return png
    if w > width or h > height:
        raise PngError(f"{w}x{h} does not fit in {width}x{height}")
    canvas = bytearray(bytes(background) * (width * height))
    x0, y0 = (width - w) // 2, (height - h) // 2
    for y in range(h):
        start = ((y0 + y) * width + x0) * 3
        canvas[start : start + w * 3] = px[y * w * 3 : (y + 1) * w * 3]
    return encode_png(width, height, bytes(canvas))
