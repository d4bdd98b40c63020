"""Progress reporting for every long loop (trainers, tokenizer CLI, dedup): a bar on a terminal, a few lines in a log.

``progress(...)`` (also exported as ``tqdm``, so a module switches with one import line) takes tqdm's
arguments and returns

- a ``tqdm.auto.tqdm`` bar when the stream (``file``, default ``sys.stderr``) is a terminal;
- otherwise a :class:`LineProgress`, which prints one plain line each time another ``every_pct`` percent of
  a known total is done (default 10 %: ten lines for any number of steps), and every ``interval`` seconds
  when the total is unknown (default 10 s), with the same postfix (``loss=… acc=…``) the bar would show.
  A last line is printed on ``close()`` if the count moved since the previous one (an iteration that ends
  by an exception prints none unless the caller closes the bar: a failing command stays one line).  No carriage returns, no
  refreshes: ``make demo > log 2>&1`` gets a few lines per stage.

``counter_progress(total, desc)`` wraps the same for a loop that reports a running count through a callback
(the BPE merge loop).  Both objects support what the call sites use: iteration, ``update(n)``, ``set_postfix(**kw)``, ``set_postfix_str``,
``set_description``, ``write(s)`` (also ``progress.write(s)`` / ``tqdm.write(s)``, which prints a line without
breaking an active bar), ``close()`` and ``with``.  ``disable=True`` gives a silent object with the same
methods; ``disable=None`` (tqdm's "off when not a terminal") means lines instead of nothing.  tqdm-only keyword
arguments (``dynamic_ncols``, ``mininterval``, ``unit_scale``…) go to the bar and are ignored by the lines.

Not handled: nested bars (``position``) in line mode (each prints its own lines), and the rate shown is the
average since the start, not a smoothed one.
"""

from __future__ import annotations

import math
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

__all__ = ["LineProgress", "counter_progress", "progress", "tqdm"]

DEFAULT_EVERY_PCT = 10.0
DEFAULT_INTERVAL_S = 10.0


def _is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def _fmt_time(s: float) -> str:
    s = int(s)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


class LineProgress:
    """tqdm's interface, printing a plain line every ``every_pct`` % of ``total`` or every ``interval`` s."""

    def __init__(
        self,
        iterable: Iterable | None = None,
        desc: str | None = None,
        total: float | None = None,
        *,
        initial: float = 0,
        unit: str = "it",
        file=None,
        disable: bool = False,
        every_pct: float = DEFAULT_EVERY_PCT,
        interval: float | None = None,
        clock=time.monotonic,
    ):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # as tqdm: the iterable's length, not counting `initial`
        self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit.strip() or "it"
        self.file, self.disable, self.clock = file, bool(disable), clock
        self.every_pct = every_pct
        self.interval = (DEFAULT_INTERVAL_S if not total else None) if interval is None else interval
        self.n = self.initial = initial
        self.postfix = ""
        self._start = self._last_t = clock()
        self._last_n, self._bucket = initial, self._bucket_of(initial)
        self._closed = False

    def _bucket_of(self, n) -> int:
        if not self.total or self.total <= 0 or not self.every_pct or self.every_pct <= 0:
            return 0
        return math.floor(n * 100.0 / (self.total * self.every_pct) + 1e-9)

    def _stream(self):
        return self.file if self.file is not None else sys.stderr

    def __iter__(self) -> Iterator:
        if self.iterable is None:
            raise TypeError("this progress object was made without an iterable")
        for x in self.iterable:
            yield x
            self.update(1)
        self.close()  # not on an exception or a `break` (GeneratorExit): close() then is the caller's to call

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        if self.disable or self._closed:
            self.n += n
            return
        self.n += n
        bucket, now = self._bucket_of(self.n), self.clock()
        if bucket > self._bucket or (self.interval and now - self._last_t >= self.interval):
            self._bucket = bucket
            self._emit(now)

    def line(self, now: float | None = None) -> str:
        """The line printed now: ``desc: n/total (p%) elapsed, rate, postfix``."""
        elapsed = (self.clock() if now is None else now) - self._start
        done = self.n - self.initial
        rate = f"{done / elapsed:.3g} {self.unit}/s" if elapsed > 0 else f"? {self.unit}/s"
        count = (
            f"{self.n:g}/{self.total:g} ({100.0 * self.n / self.total:.0f}%)"
            if self.total
            else f"{self.n:g} {self.unit}"
        )
        parts = [count, _fmt_time(elapsed), rate] + ([self.postfix] if self.postfix else [])
        return (f"{self.desc}: " if self.desc else "") + ", ".join(parts)

    def _emit(self, now: float) -> None:
        self._last_t, self._last_n = now, self.n
        self.write(self.line(now))

    def set_postfix(self, ordered_dict: dict | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = str(s)

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc

    def refresh(self) -> None:
        pass

    def write(self, s: str, file=None, end: str = "\n") -> None:
        if self.disable:
            return
        stream = file if file is not None else self._stream()
        stream.write(s + end)
        stream.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.disable and self.n != self._last_n:
            self._emit(self.clock())


def progress(
    iterable: Iterable | None = None,
    desc: str | None = None,
    total: float | None = None,
    *,
    file=None,
    disable: bool | None = False,
    every_pct: float = DEFAULT_EVERY_PCT,
    interval: float | None = None,
    **tqdm_kwargs: Any,
):
    """A tqdm bar on a terminal, a :class:`LineProgress` otherwise (module docstring)."""
    stream = file if file is not None else sys.stderr
    if _is_tty(stream) and not disable:
        from tqdm.auto import tqdm as _tqdm

        return _tqdm(iterable, desc=desc, total=total, file=file, **tqdm_kwargs)
    keep = {k: tqdm_kwargs[k] for k in ("initial", "unit") if k in tqdm_kwargs}
    return LineProgress(
        iterable, desc, total, file=file, disable=bool(disable), every_pct=every_pct, interval=interval, **keep
    )


@contextmanager
def counter_progress(
    total: int, desc: str, *, unit: str = "it", enabled: bool = True, file=None
) -> Iterator[Callable[[int], None] | None]:
    """For loops that report a running count (``callback(done)``) instead of iterating: yields that callback
    (None when not ``enabled``), shown as :func:`progress` on ``file`` (default stderr), closed on exit."""
    if not enabled:
        yield None
        return
    bar = progress(total=total, desc=desc, unit=unit, file=file if file is not None else sys.stderr, mininterval=1.0)

    def report(done: int) -> None:
        bar.update(min(done, total) - bar.n)

    try:
        yield report
    finally:
        bar.close()


def _write(s: str, file=None, end: str = "\n", nolock: bool = False) -> None:
    """Print a line without breaking an active bar (tqdm.write; plain print when no bar is shown)."""
    from tqdm.auto import tqdm as _tqdm

    _tqdm.write(s, file=file, end=end, nolock=nolock)


progress.write = _write  # type: ignore[attr-defined]
tqdm = progress  # drop-in for `from tqdm.auto import tqdm` at the call sites
