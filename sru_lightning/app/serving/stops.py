"""The end of a completion at a stop string, found in its text (not in its tokens): a stop string
may span several tokens, or end inside one.

Text that could still be the start of a stop string is held back until the next token shows
whether it is, so a client never receives text that is then cut.
"""

from __future__ import annotations

__all__ = ["StopText"]


class StopText:
    """Feed a completion's text piece by piece; each call says what may be sent now and whether
    a stop string was found (the text ends just before it, the stop string itself is not sent)."""

    def __init__(self, stops: tuple[str, ...] = ()) -> None:
        self.stops = stops
        self._held = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """(text to send now, True when a stop string ended the completion)."""
        if not self.stops:
            return text, False
        held = self._held + text
        found = [position for position in (held.find(stop) for stop in self.stops) if position >= 0]
        if found:
            self._held = ""
            return held[: min(found)], True
        keep = max((self._partial(held, stop) for stop in self.stops), default=0)
        self._held = held[len(held) - keep :] if keep else ""
        return held[: len(held) - keep], False

    def flush(self) -> str:
        """The text held back, at the end of a completion that no stop string ended."""
        held, self._held = self._held, ""
        return held

    @staticmethod
    def _partial(text: str, stop: str) -> int:
        """The length of the longest end of `text` that begins `stop` (0: none)."""
        for length in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:length]):
                return length
        return 0
