"""Cutting output so that no chunk ends inside a UTF-8 sequence."""

from __future__ import annotations



def _sequence_length(lead: int) -> int:
    """The length of the UTF-8 sequence a lead byte starts; 0 if it starts none."""
    if 0xC2 <= lead <= 0xDF:
        return 2
    if 0xE0 <= lead <= 0xEF:
        return 3
    if 0xF0 <= lead <= 0xF4:
        return 4
    return 0


def whole_prefix(b: bytes) -> int:
    """The length of the longest prefix of ``b`` that does not end inside a
    UTF-8 sequence: an incomplete sequence at the end (a lead byte and fewer
    continuation bytes than it announces) is left out; anything else,
    invalid bytes included, is kept."""
    n = len(b)
    for i in range(n - 1, max(n - 4, -1), -1):
        c = b[i]
        if c & 0xC0 == 0x80:  # a continuation byte: look further back
            continue
        need = _sequence_length(c)
        return i if need > n - i else n
    return n


class Splitter:
    """Holds back the incomplete UTF-8 sequence a chunk of one stream ends
    with until the next chunk completes it (or the stream ends)."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> bytes:
        """The bytes of ``data`` (after what was held back) that end on a
        character boundary; the rest is held back."""
        data = self._pending + data
        k = whole_prefix(data)
        self._pending = data[k:]
        return data[:k]

    def flush(self) -> bytes:
        """What was held back: the stream ended."""
        out, self._pending = self._pending, b""
        return out
