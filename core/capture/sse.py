"""Incremental Server-Sent Events decoding: network reads split events anywhere."""

from __future__ import annotations


class SSEDecoder:
    """Feed raw bytes as they arrive; get back the `data` payload of each complete event."""

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        buf = self._buf + chunk if self._buf else chunk
        *lines, self._buf = buf.split(b"\n")  # the last piece has no line break yet
        events: list[str] = []
        for line in lines:  # the common lines inline: a recorded stream has two per chunk
            if line.startswith(b"data:"):
                value = line[6:] if line.startswith(b"data: ") else line[5:]
                self._data.append(value.rstrip(b"\r").decode("utf-8", errors="replace"))
            elif line == b"" or line == b"\r":
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            else:
                self._line(line.rstrip(b"\r").decode("utf-8", errors="replace"), events)
        return events

    def flush(self) -> list[str]:
        """End of stream: a last event without its blank line still counts."""
        events: list[str] = []
        if self._buf:
            self._line(self._buf.rstrip(b"\r").decode("utf-8", errors="replace"), events)
            self._buf = b""
        self._line("", events)
        return events

    @staticmethod
    def payloads(stream: bytes) -> list[bytes]:
        """The `data` payloads of a whole stream (what feed + flush decode), as its bytes: a
        recorded stream is read once, after the client has it, without a decode per line."""
        events: list[bytes] = []
        data: list[bytes] = []
        for line in stream.split(b"\n"):  # the last piece, without its line break, is a line too
            line = line.rstrip(b"\r")
            if line.startswith(b"data:"):
                data.append(line[6:] if line.startswith(b"data: ") else line[5:])
            elif not line:
                if data:
                    events.append(b"\n".join(data))
                    data = []
            # comments and other fields (event:, id:, retry:) carry nothing we record
        if data:
            events.append(b"\n".join(data))
        return events

    def _line(self, line: str, events: list[str]) -> None:
        if line == "":
            if self._data:
                events.append("\n".join(self._data))
                self._data = []
        elif line.startswith(":"):
            return  # comment / keep-alive
        elif line.startswith("data:"):
            value = line[5:]
            self._data.append(value[1:] if value.startswith(" ") else value)
        # other fields (event:, id:, retry:) carry nothing we record


def encode_event(data: str) -> bytes:
    return b"".join(b"data: " + line.encode() + b"\n" for line in data.split("\n")) + b"\n"
