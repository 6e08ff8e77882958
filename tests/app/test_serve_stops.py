"""`serve`'s stop strings (`serving/stops.py`): the text ends before the first stop string, found in
the text whatever the tokens' boundaries, and no text that is then cut is ever sent."""

from __future__ import annotations

import pytest

from sru_lightning.app.serving.stops import StopText


def fed(pieces: list[str], stops: tuple[str, ...]) -> tuple[list[str], bool]:
    matcher, sent = StopText(stops), []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        sent.append(text)
        if stopped:
            return sent, True
    sent.append(matcher.flush())
    return sent, False


@pytest.mark.parametrize(
    "pieces, stops, text, stopped",
    [
        (["ab", "c.", "de"], (".",), "abc", True),
        (["a", "b", "\n", "\n", "x"], ("\n\n",), "ab", True),  # across tokens
        (["ab\n", "\nx"], ("\n\n",), "ab", True),
        (["xy", "zEN", "D tail"], ("END", "zz"), "xyz", True),  # the first one found in the text
        (["a", "\n", "b", "c"], ("\n\n",), "a\nbc", False),  # a held start that was not a stop is sent
        (["ab", "cd"], (), "abcd", False),
        (["stop here"], ("stop",), "", True),
    ],
)
def test_the_text_ends_before_the_first_stop_string(pieces, stops, text, stopped):
    sent, found = fed(pieces, stops)
    assert ("".join(sent), found) == (text, stopped)


def test_text_that_may_begin_a_stop_string_is_held_until_it_is_known():
    matcher = StopText(("###",))
    assert matcher.feed("ab#") == ("ab", False)
    assert matcher.feed("#") == ("", False)
    assert matcher.feed("x") == ("##x", False)
    assert matcher.feed("##") == ("", False)
    assert matcher.feed("#") == ("", True)
