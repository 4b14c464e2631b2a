"""`sse_events`: the upstream's stream cut into SSE data payloads, whatever the reads' boundaries."""

import pytest

from harnessrl.proxy.upstream.vllm_wire import sse_events

pytestmark = pytest.mark.unit


def _cut(reads: list[bytes]) -> tuple[list[bytes], bytes]:
    buf = bytearray()
    out = [p for data in reads for p in sse_events(buf, data)]
    return out, bytes(buf)


def test_many_events_in_one_read_come_out_in_order_and_the_unfinished_one_waits():
    out, rest = _cut([b'data: {"a":1}\n\ndata: {"a":2}\n\ndata: [DONE]\n\ndata: {"par'])
    assert out == [b'{"a":1}', b'{"a":2}', b"[DONE]"]
    assert rest == b'data: {"par'


def test_an_event_split_across_reads_and_a_crlf_split_between_them():
    # the `\r` of the first `\r\n` ends one read and its `\n` starts the next: the `\r` stays in
    # the payload, where JSON reads it as whitespace
    out, rest = _cut([b"data: {\"x\"", b":1}\r", b"\n\r\n", b"data: 2\r\n\r\n"])
    assert out == [b'{"x":1}\r', b"2"]
    assert rest == b""


def test_multi_line_data_comments_other_fields_and_blank_events():
    stream = b": keep-alive\n\nevent: delta\ndata: a\ndata:b\nid: 7\n\n\n\ndata:   c\n\n\n"
    out, rest = _cut([stream])
    # a comment-only and a blank event carry no data; `data:` lines join with a newline, each
    # without its leading spaces; three newlines leave the third as the next event's start
    assert out == [b"a\nb", b"c"]
    assert rest == b"\n"
