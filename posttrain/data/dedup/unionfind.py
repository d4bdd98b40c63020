"""Clusters from verified duplicate pairs: connected components, each labelled by its smallest index.

Labelling by the minimum index makes the representative deterministic (the first document of the
cluster in input order) whatever the order in which pairs arrive. Two implementations:

- :func:`components` -- vectorised min-label hooking with pointer jumping (Shiloach-Vishkin style):
  repeat ``hook every edge's larger root onto the smaller root`` (np.minimum.at) then
  ``label = label[label]`` until every edge has equal labels. O((n + E) log n) numpy work.
- :func:`components_loop` -- the textbook union-find with path halving and union by min index,
  a Python loop over pairs; the oracle for the vectorised one.

Note that clusters are transitive closures: A~B and B~C put A and C together even if J(A, C) is
below the threshold (the usual behaviour of MinHash dedup pipelines).
"""

from __future__ import annotations

import numpy as np


def components(n: int, pairs: np.ndarray) -> np.ndarray:
    """labels (n,) int64 with labels[i] = min index of i's component; pairs (E, 2) int."""
    labels = np.arange(n, dtype=np.int64)
    if len(pairs) == 0:
        return labels
    u, v = pairs[:, 0].astype(np.int64), pairs[:, 1].astype(np.int64)
    while True:
        lu, lv = labels[u], labels[v]
        diff = lu != lv
        if not diff.any():
            return labels
        u, v, lu, lv = u[diff], v[diff], lu[diff], lv[diff]
        lo, hi = np.minimum(lu, lv), np.maximum(lu, lv)
        np.minimum.at(labels, hi, lo)  # hook the larger root under the smaller
        while True:  # pointer jumping to the roots
            nxt = labels[labels]
            if np.array_equal(nxt, labels):
                break
            labels = nxt


def components_loop(n: int, pairs) -> list[int]:
    """Pure-Python union-find twin of :func:`components` (path halving, root = min index)."""
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(int(a)), find(int(b))
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return [find(i) for i in range(n)]
