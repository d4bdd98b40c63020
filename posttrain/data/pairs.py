"""{prompt, answer} JSONL files: SFT demonstrations and the evaluation sets every trainer and ``posttrain eval`` read.

Each record needs a string ``prompt`` and an ``answer`` that is a string or a number (not a bool; numbers
become their ``str``). The result remembers each pair's line (:class:`~posttrain.data.checks.Located`) so
later checks (unknown characters, the model's window) can name ``file:line``. An empty file is an error.

Not handled: multi-turn conversations, several reference answers per prompt.
"""

from __future__ import annotations

from posttrain.data.checks import Located
from posttrain.data.io import iter_jsonl
from posttrain.errors import DataError


def load_pairs(path: str, what: str) -> Located:
    """{prompt, answer} JSONL -> list of (prompt, answer) pairs that remembers each one's line, with
    file:line errors for bad records. The answer may be a string or a number (not a bool)."""
    pairs = Located(source=str(path), lines=[])
    for line, rec in iter_jsonl(path, required=("prompt", "answer")):
        p, a = rec["prompt"], rec["answer"]
        if not isinstance(p, str) or isinstance(a, bool) or not isinstance(a, (str, int, float)):
            raise DataError(f"{path}:{line}: 'prompt' must be a string and 'answer' a string or number")
        pairs.append((p, str(a)))
        pairs.lines.append(line)
    if not pairs:
        raise DataError(f"{path}: no {what} records (the file is empty)")
    return pairs
