"""Benchmark contamination: a training document is contaminated by an evaluation item when they share
at least one word n-gram (default n = 13, as in GPT-3's contamination study, Brown et al. 2020 app. C).

Both sides are normalised the same way (default: NFKC, lower-case, punctuation -> space, collapse
whitespace) and their word n-grams hashed with :func:`shingles.word_shingles` (64-bit, so a false
match needs a 2^-64 collision). The evaluation n-grams form a sorted array with the owning item of
each; training batches are checked with ``np.isin`` and matched back with ``searchsorted``, so the
cost is O(training n-grams * log(eval n-grams)) with no Python loop per n-gram.

An evaluation item with fewer than n words (but at least ``min_words``) is matched on its whole word
sequence: the training side is then also hashed at that length. Shorter items are reported as not
checkable rather than matched on a few common words.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from posttrain.data.dedup.shingles import normalize, word_shingles

CONTAMINATION_NORMALIZE = ("nfkc", "lower", "punct", "whitespace")


@dataclass
class EvalIndex:
    """N-gram hashes of the evaluation items, grouped by n-gram length."""

    n: int
    by_len: dict[int, tuple[np.ndarray, np.ndarray]]  # length -> (sorted hashes, item index of each)
    item_ids: list
    item_sources: list[str]
    too_short: list = field(default_factory=list)


def build_eval_index(
    items: Sequence[tuple[str, object, str]],
    n: int = 13,
    min_words: int = 5,
    steps: Sequence[str] = CONTAMINATION_NORMALIZE,
) -> EvalIndex:
    """Index evaluation items given as (source name, item id, text)."""
    groups: dict[int, list[tuple[int, str]]] = defaultdict(list)
    ids, sources, too_short = [], [], []
    for src, item_id, text in items:
        norm = normalize(text, steps)
        nw = len(norm.split())
        if nw < min_words:
            too_short.append({"source": src, "id": item_id, "words": nw})
            continue
        groups[min(n, nw)].append((len(ids), norm))
        ids.append(item_id)
        sources.append(src)
    by_len = {}
    for length, lst in groups.items():
        hashes, off = word_shingles([t for _, t in lst], length)
        owner = np.repeat(np.array([i for i, _ in lst], np.int64), np.diff(off))
        order = np.argsort(hashes, kind="stable")
        by_len[length] = (hashes[order], owner[order])
    return EvalIndex(n, by_len, ids, sources, too_short)


def check_batch(
    index: EvalIndex, texts: Sequence[str], steps: Sequence[str] = CONTAMINATION_NORMALIZE
) -> list[list[int]]:
    """For each training text, the sorted eval item indices it shares an n-gram with ([] if none)."""
    norm = [normalize(t, steps) for t in texts]
    hits: list[set] = [set() for _ in texts]
    for length, (ehash, eowner) in index.by_len.items():
        hashes, off = word_shingles(norm, length)
        m = np.isin(hashes, ehash)
        if not m.any():
            continue
        pos = np.flatnonzero(m)
        doc = np.searchsorted(off, pos, side="right") - 1
        lo = np.searchsorted(ehash, hashes[pos], side="left")
        hi = np.searchsorted(ehash, hashes[pos], side="right")
        for d, a, b in zip(doc.tolist(), lo.tolist(), hi.tolist()):
            hits[d].update(eowner[a:b].tolist())
    return [sorted(h) for h in hits]
