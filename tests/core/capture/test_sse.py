from harness_env.core.capture.sse import SSEDecoder, encode_event


def test_events_split_anywhere_are_reassembled():
    stream = b'data: {"a": 1}\n\ndata: {"b": 2}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n'
    for size in (1, 2, 3, 7, len(stream)):
        dec = SSEDecoder()
        events = []
        for i in range(0, len(stream), size):
            events += dec.feed(stream[i : i + size])
        events += dec.flush()
        assert events == ['{"a": 1}', '{"b": 2}', "[DONE]"], size


def test_multiline_data_and_missing_final_blank_line():
    dec = SSEDecoder()
    assert dec.feed(b"data: line1\ndata: line2\n\ndata:x") == ["line1\nline2"]
    assert dec.flush() == ["x"]


def test_utf8_split_inside_a_character():
    data = 'data: {"t": "é€"}\n\n'.encode()
    dec = SSEDecoder()
    out = []
    for b in data:
        out += dec.feed(bytes([b]))
    assert out == ['{"t": "é€"}']


def test_encode_roundtrip():
    dec = SSEDecoder()
    assert dec.feed(encode_event("a\nb")) == ["a\nb"]


STREAMS = [
    b'data: {"a": 1}\n\ndata: {"b": 2}\r\n\r\n: keep-alive\n\ndata: [DONE]\n\n',
    b"data: line1\ndata: line2\n\ndata:x",
    b"data:no space\r\n\r\r\nevent: e\nid: 3\ndata:  two spaces\n\n\n\ndata: [DONE]",
    'data: {"t": "é€"}\n\n'.encode() + b"data: \xff\xfe\n\n",
    b"data: \r\ndata:\n\n:comment\r\ndata: last\r",
    b"data: a\n\n\ndata: b\n\ndata: \n\n\n\ndata: c\ndata: d\n\n: c\ndata: e\n\ndata:f\n",
    b"\n\ndata: x\n\ndata: y\n",
    b"data: [DONE]",
]


def test_a_whole_streams_payloads_are_what_feed_and_flush_decode():
    for stream in STREAMS:
        dec = SSEDecoder()
        decoded = [*dec.feed(stream), *dec.flush()]
        assert [p.decode("utf-8", errors="replace") for p in SSEDecoder.payloads(stream)] == decoded, stream
