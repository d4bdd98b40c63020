"""Training corpora: stream text from files and collapse it into a word-frequency table, in parallel.

Key insight: every trainer here only needs ``{word: count}`` after normalisation and
pre-tokenisation — a 50 MB corpus collapses to a few hundred thousand distinct words — so the corpus
is read once, streamed (never held whole in memory), cut into ~1 MB batches of lines and counted by
a pool of worker processes (``fork``), then the per-batch counters are summed. Where it gives the
same words (``JoinedWords``), a batch is split by *one* regex pass over its joined texts and counted
by one ``Counter`` call, instead of a regex call and a counter update per line.

Inputs: plain text (one text per line) or JSONL (``text_field`` of each record, which must be a
string: a null, number, boolean, array or object there is a ``DataError`` naming ``file:line``, never
trained on as its Python ``str()``). Bytes that are not
valid UTF-8: byte-level BPE keeps them (``surrogateescape``, so they round-trip as bytes); the other
models replace them with U+FFFD, count the lines affected and report them through ``warn``.

Not handled: compressed inputs, Parquet.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from operator import methodcaller
from pathlib import Path

from posttrain.errors import DataError, UserError

BATCH_CHARS = 1 << 20  # small enough that workers start early and finish together


@dataclass
class ReadReport:
    lines: int = 0
    chars: int = 0
    invalid_utf8_lines: int = 0
    bad_json_lines: int = 0


def iter_texts(
    paths: Iterable[str | Path],
    *,
    text_field: str | None = None,
    keep_bytes: bool = False,
    report: ReadReport | None = None,
    keep_newlines: bool = False,
) -> Iterator[str]:
    """Yield texts (lines, or ``record[text_field]`` for JSONL) from files; ``-`` reads stdin."""
    report = report if report is not None else ReadReport()
    errors = "surrogateescape" if keep_bytes else "replace"
    for path in paths:
        if str(path) == "-":
            fh = sys.stdin.buffer
        else:
            p = Path(path)
            if not p.exists():
                raise DataError(f"input file not found: {p}")
            if p.is_dir():
                raise DataError(f"{p} is a directory, expected a text or JSONL file")
            fh = open(p, "rb")
        try:
            for line_no, raw in enumerate(fh, 1):
                report.lines += 1
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    line = raw.decode("utf-8", errors)
                    report.invalid_utf8_lines += 1
                if text_field is not None:
                    if not line.strip():
                        continue
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError as e:
                        raise DataError(f"{path}:{line_no}: not valid JSON ({e.msg})") from None
                    except (ValueError, RecursionError) as e:  # an integer of > 4300 digits; nesting too deep
                        why = "nested too deeply" if isinstance(e, RecursionError) else str(e).split(":")[0].lower()
                        raise DataError(f"{path}:{line_no}: not valid JSON ({why})") from None
                    if not isinstance(rec, dict):
                        raise DataError(f"{path}:{line_no}: expected a JSON object, got {_json_type(rec)}")
                    if text_field not in rec:
                        raise DataError(f"{path}:{line_no}: record has no field {text_field!r}")
                    line = rec[text_field]
                    if not isinstance(line, str):
                        raise DataError(
                            f"{path}:{line_no}: field {text_field!r} is {_json_type(line)}, expected a "
                            f"string (the text to train on)"
                        )
                elif not keep_newlines:
                    line = line.rstrip("\r\n")
                report.chars += len(line)
                yield line
        finally:
            if fh is not sys.stdin.buffer:
                fh.close()


def _json_type(v) -> str:
    """The JSON name of a parsed value's type: null, a boolean, a number, an array, an object, a string."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    return {int: "a number", float: "a number", list: "an array", dict: "an object", str: "a string"}.get(
        type(v), type(v).__name__
    )


def _batches(texts: Iterable[str], batch_chars: int) -> Iterator[list[str]]:
    batch, n = [], 0
    for t in texts:
        batch.append(t)
        n += len(t)
        if n >= batch_chars:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


class JoinedWords:
    r"""A ``words_fn`` that can also count a whole batch with one pass over its joined texts.

    ``words(text)`` splits one text; ``joined(sep.join(texts))`` must give the same words as all the
    texts split one by one. With ``sep="\n"`` that holds for splitters whose words never contain or
    look at whitespace (``Whitespace``: ``\w+|[^\w\s]+``). With ``lines=True`` (and ``sep=""``) it holds
    for a splitter that treats each ``\n`` as the end of a text (``pre_tokenizers.GPT2_LINES_PATTERN``),
    and is used only when every text of the batch is one line ending in its only ``\n`` (what
    ``iter_texts(keep_newlines=True)`` yields for plain text); other batches are split text by text.
    With ``sep_free=True`` the joined pass is used only when no text holds ``sep`` itself (JSONL fields
    may hold newlines). ``joined`` may return the words or a ``Counter`` of them.
    """

    def __init__(
        self,
        words: Callable[[str], list[str]],
        joined: Callable[[str], Iterable[str] | Counter],
        *,
        sep: str = "\n",
        lines: bool = False,
        sep_free: bool = False,
    ):
        self.words, self.joined, self.sep, self.lines, self.sep_free = words, joined, sep, lines, sep_free

    def __call__(self, text: str) -> list[str]:
        return self.words(text)

    def count(self, batch: list[str]) -> Counter:
        text = self.sep.join(batch)
        if self.lines:
            ends = list(map(_ends_with_newline, batch))
            one_line_each = all(ends[:-1]) and text.count("\n") == sum(ends)  # the last text may lack its "\n"
        if (self.lines and not one_line_each) or (self.sep_free and text.count(self.sep) != len(batch) - 1):
            c: Counter = Counter()
            for t in batch:
                c.update(self.words(t))
            return c
        out = self.joined(text)
        return out if isinstance(out, Counter) else Counter(out)


_ends_with_newline = methodcaller("endswith", "\n")


_WORDS_FN: Callable[[str], list[str]] | None = None


def _count_batch(batch: list[str]) -> Counter:
    fn = _WORDS_FN
    if isinstance(fn, JoinedWords):
        return fn.count(batch)
    c: Counter = Counter()
    for t in batch:
        c.update(fn(t))  # type: ignore[misc]
    return c


def count_words(
    texts: Iterable[str],
    words_fn: Callable[[str], list[str]],
    *,
    workers: int | None = None,
    batch_chars: int = BATCH_CHARS,
) -> dict[str, int]:
    """{word: count} over ``texts`` split by ``words_fn``; ``workers`` processes (default: all cores)."""
    global _WORDS_FN
    workers = workers or os.cpu_count() or 1
    _WORDS_FN = words_fn
    total: Counter = Counter()
    if workers <= 1:
        for b in _batches(texts, batch_chars):
            total.update(_count_batch(b))
    else:
        with mp.get_context("fork").Pool(workers) as pool:
            for c in pool.imap_unordered(_count_batch, _batches(texts, batch_chars)):
                if not total:
                    total = c
                else:
                    total.update(c)
    if not total:
        raise UserError("the training corpus is empty (no words after pre-tokenisation)")
    return dict(total)


def warn_report(report: ReadReport, warn: Callable[[str], None] | None, byte_level: bool) -> None:
    if warn is None or not report.invalid_utf8_lines:
        return
    if byte_level:
        warn(
            f"{report.invalid_utf8_lines} input line(s) were not valid UTF-8; byte-level BPE trains on their raw bytes"
        )
    else:
        warn(f"{report.invalid_utf8_lines} input line(s) were not valid UTF-8; invalid bytes were replaced with U+FFFD")
