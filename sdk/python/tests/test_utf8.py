"""The splitter that keeps chunks on UTF-8 character boundaries."""

from __future__ import annotations

from corral._utf8 import Splitter, whole_prefix

TEXT = "a€b𝄞c\u00e9d".encode()  # 1-, 3-, 4- and 2-byte characters


def test_every_cut_of_every_character_arrives_whole() -> None:
    for cut in range(len(TEXT) + 1):
        for cut2 in range(cut, len(TEXT) + 1):
            s = Splitter()
            parts = [s.feed(TEXT[:cut]), s.feed(TEXT[cut:cut2]), s.feed(TEXT[cut2:]), s.flush()]
            assert b"".join(parts) == TEXT
            for p in parts:
                p.decode("utf-8")  # strict


def test_bytes_that_are_not_utf8_pass() -> None:
    s = Splitter()
    assert s.feed(b"\xff\xfe") == b"\xff\xfe"
    assert s.feed(b"x\xe2") == b"x"
    assert s.feed(b"\xff") == b"\xe2\xff"  # not a continuation: passed on as it is
    assert s.flush() == b""
    assert s.feed(b"\xe2\x82") == b"" and s.flush() == b"\xe2\x82"  # the stream ended inside one
    assert whole_prefix(b"\x80\x80\x80\x80") == 4
