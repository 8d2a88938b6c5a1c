"""How a result and a request are kept: compact and compressed.

A result is stored in storage.pack's linear form (a turn that continues its parent keeps only the
tokens and messages it adds), split into its header (everything but the turns) and one part per
turn, each zlib-compressed JSON; `decode_result` rebuilds the exact RolloutResult.
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson

from harness_env.models import RolloutResult
from harness_env.storage import FORMAT, pack, unpack

ENCODING = "zlib+" + FORMAT
LEVEL = 6  # zlib's default: most of the gain at a fraction of level 9's time


def compress(data: Any) -> bytes:
    return zlib.compress(orjson.dumps(data), LEVEL)


def decompress(blob: bytes) -> Any:
    return orjson.loads(zlib.decompress(blob))


def encode_result(result: RolloutResult) -> tuple[bytes, list[bytes]]:
    """(header, turns): the compressed parts of `result`'s packed form."""
    data = pack(result)
    turns = data.pop("proxy_turns")
    return compress(data), [compress(t) for t in turns]


def decode_result(encoding: str, header: bytes, turns: list[bytes]) -> RolloutResult:
    if encoding != ENCODING:
        raise ValueError(f"stored result encoded as {encoding!r}, which this version cannot read (it reads {ENCODING!r})")
    data = decompress(header)
    data["proxy_turns"] = [decompress(t) for t in turns]
    return unpack(data)
