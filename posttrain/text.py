r"""Untrusted text made safe to print: control characters shown as escapes, normal Unicode kept.

Model output and user data reach the terminal in sample prints, eval prints and error messages
that quote a record. Printed raw, ``ESC[2J`` clears the screen, ``ESC]0;title BEL`` sets the window
title, and a bidi override reorders what the reader sees. :func:`printable` replaces every such
character with a Python-style escape and leaves everything else (letters of every script, CJK,
emoji, ZWJ/ZWNJ) alone:

    printable("a\x1b[2Jb\n")  ->  prints  a\x1b[2Jb\n   (for the string a ESC [ 2 J b newline)

Escaped: C0 controls (U+0000-U+001F, including tab and newline, so a sample stays on one line),
DEL, C1 controls (U+0080-U+009F, which some terminals obey as ESC sequences), lone surrogates (bytes
kept by ``surrogateescape``), the bidirectional controls (U+061C, U+200E, U+200F, U+202A-U+202E,
U+2066-U+2069) and the line/paragraph separators U+2028/U+2029.

Not handled: the output is for display only: a backslash is not escaped, so it does not round-trip
(``printable`` of the text ``\x1b`` and of an ESC character look alike). Use ``repr`` or JSON to store.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _escape(m: re.Match) -> str:
    c = m.group()
    if c in _NAMED:
        return _NAMED[c]
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def printable(s: object, limit: int | None = None) -> str:
    """``str(s)`` with control and bidi characters escaped; cut to ``limit`` characters (then ``...``)."""
    s = s if isinstance(s, str) else str(s)
    if limit is not None and len(s) > limit:
        s = s[:limit]
        return _UNSAFE.sub(_escape, s) + "..."
    return _UNSAFE.sub(_escape, s)
