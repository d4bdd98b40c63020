"""The merge engine BPE and WordPiece share: words as strings of symbol characters, pair counts, merges.

Key insight: give every symbol an id ``i`` and write it as the character ``chr(i)``; a word is then a
``str``, a pair is a 2-character string, finding a pair is ``str.find`` and merging it everywhere is
``str.replace`` — all in C. Training keeps, per pair, its weighted count and an index pair -> words
holding it (``count_pairs``), so a merge touches only those words (``apply_merge``) and returns the
change of every pair count it caused; the two trainers differ only in how they *pick* the next pair
(BPE: the most frequent, through a lazy heap; WordPiece: the best likelihood score, through numpy).

``merge_few`` merges word by word (one occurrence: only the two neighbouring pairs change,
``x a b y -> x C y`` removes ``xa, by`` and adds ``xC, Cy``); ``merge_many`` does the same for many words
at once in numpy over the joined words. ``merge_ids`` (lists of any symbols) and ``merge_word`` (lists of
ids) are the plain versions the slow oracles and the tests use.

Not handled: symbol ids at or above U+10FFFF (``SEP``, the separator of joined words); the trainers
reject vocabularies that large.
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from functools import partial
from operator import itemgetter

import numpy as np

from posttrain.errors import UserError

VECTOR_MIN_WORDS = 64  # a merge touching at least this many words is applied with numpy (merge_many)
SEP = chr(0x10FFFF)  # never a symbol id (ids stay below it)


def merge_ids(ids: list, a, b, new) -> list:
    """ids=[1, 2, 3, 1, 2], pair=(1, 2), new=4 -> [4, 3, 4] (left to right, non-overlapping); any symbols
    (ids, or the slow oracles' strings)."""
    out, i, n = [], 0, len(ids)
    while i < n:
        if i < n - 1 and ids[i] == a and ids[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(ids[i])
            i += 1
    return out


def merge_word(w: list[int], a: int, b: int, c: int):
    """Merge (a, b) -> c in word ``w`` and report which adjacent pairs changed, for incremental counts.

    Returns None if (a, b) does not occur, else (new_word, removed_pairs, added_pairs): pairs that
    overlap a merge site disappear, pairs touching a new ``c`` appear; every other pair is unchanged.
    w=[x, a, b, a, b, y] -> [x, c, c, y], removed [(x,a), (a,b), (b,a), (a,b), (b,y)],
    added [(x,c), (c,c), (c,y)]."""
    n = len(w)
    out: list[int] = []
    merged: list[int] = []
    removed: list[tuple[int, int]] = []
    last = -1  # last old pair position already removed
    i = 0
    while True:
        try:
            j = w.index(a, i)
        except ValueError:
            break
        if j + 1 < n and w[j + 1] == b:
            out.extend(w[i:j])
            merged.append(len(out))
            out.append(c)
            for q in (j - 1, j, j + 1):
                if q > last and 0 <= q < n - 1:
                    removed.append((w[q], w[q + 1]))
                    last = q
            i = j + 2
        else:
            out.extend(w[i : j + 1])
            i = j + 1
    if not merged:
        return None
    out.extend(w[i:])
    m = len(out)
    added: list[tuple[int, int]] = []
    last = -1
    for k in merged:
        for q in (k - 1, k):
            if q > last and 0 <= q < m - 1:
                added.append((out[q], out[q + 1]))
                last = q
    return out, removed, added


def count_pairs(words: list[str], counts: list[int]):
    """Initial {pair: weighted count} and {pair: indices of the words holding it}; pairs are 2-char strings.

    Vectorised: all words joined by a separator into one code-point array, pair keys
    ``left << 21 | right``, grouped by one sort. ["ab", "abb"], counts [2, 1] -> {"ab": 3, "bb": 1},
    {"ab": [0, 1], "bb": [1]} (a word holding a pair twice is listed twice). The index lists are
    ``array('i')`` (4 bytes an entry, not a pointer plus an int object: a third of the memory)."""
    pc: dict[str, int] = {}
    where: dict[str, array] = defaultdict(new_index)
    if not words:
        return pc, where
    sep = 0x10FFFF
    arr = np.frombuffer(chr(sep).join(words).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    wid = np.cumsum(arr == sep)  # word index of each position
    left, right = arr[:-1], arr[1:]
    ok = (left != sep) & (right != sep)
    keys = (left[ok].astype(np.int64) << 21) | right[ok]  # (P,)
    wof = wid[:-1][ok]  # (P,)
    del arr, wid, left, right, ok
    if not keys.size:
        return pc, where
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    wof = wof[order]
    del order
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))  # (U,)
    weights = np.asarray(counts, dtype=np.int64)[wof]
    totals = np.add.reduceat(weights, starts).tolist()
    uniq = keys[starts].tolist()
    bounds = starts.tolist() + [len(keys)]
    wb = wof.astype(np.int32).tobytes()
    mask = (1 << 21) - 1
    for g, k in enumerate(uniq):
        p = chr(k >> 21) + chr(k & mask)
        pc[p] = totals[g]
        where[p] = ix = array("i")
        ix.frombytes(wb[4 * bounds[g] : 4 * bounds[g + 1]])
    return pc, where


new_index = partial(array, "i")


def merge_string(s: str, ab: str, c: str):
    """``merge_word`` for a word held as a string of symbol characters; same (new, removed, added),
    with pairs as 2-character strings. s="xababy", ab="ab", c="C" -> ("xCCy", ["xa", "ab", "ba", "ab", "by"],
    ["xC", "CC", "Cy"]); None when ``ab`` does not occur."""
    j = s.find(ab)
    if j < 0:
        return None
    n = len(s)
    removed: list[str] = []
    sites: list[int] = []
    last = -1
    while j >= 0:
        sites.append(j - len(sites))  # the merged symbol's position in the new word
        for q in (j - 1, j, j + 1):
            if q > last and 0 <= q < n - 1:
                removed.append(s[q : q + 2])
                last = q
        j = s.find(ab, j + 2)
    ns = s.replace(ab, c)
    m = len(ns)
    added: list[str] = []
    last = -1
    for k in sites:
        for q in (k - 1, k):
            if q > last and 0 <= q < m - 1:
                added.append(ns[q : q + 2])
                last = q
    return ns, removed, added


def merge_few(words: list[str], counts: list[int], touched, ab: str, c: str, where) -> dict[str, int]:
    """Merge ``ab`` -> ``c`` in the ``touched`` words, one by one; returns {pair: count change} (``ab``
    itself excluded) and adds the words to ``where`` under their new pairs."""
    a, b = ab
    delta: dict[str, int] = defaultdict(int)
    # `where` lists a word once per occurrence of the pair: visit each word once (a word holding the pair
    # k times was otherwise searched k times, the last k - 1 in full: quadratic in one long word)
    for wi in dict.fromkeys(touched):
        s = words[wi]
        j = s.find(ab)
        if j < 0:  # the index is allowed to hold words that lost the pair
            continue
        n = counts[wi]
        if s.find(ab, j + 2) < 0:  # one occurrence: x a b y -> x c y
            words[wi] = s[:j] + c + s[j + 2 :]
            if j:
                x = s[j - 1]
                delta[x + a] -= n
                p = x + c
                delta[p] += n
                where[p].append(wi)
            if j + 2 < len(s):
                y = s[j + 2]
                delta[b + y] -= n
                p = c + y
                delta[p] += n
                where[p].append(wi)
        else:
            words[wi], removed, added = merge_string(s, ab, c)
            for p in removed:
                delta[p] -= n
            for p in added:
                delta[p] += n
                where[p].append(wi)
    delta.pop(ab, None)
    return delta


def merge_many(words: list[str], counts_np, touched, ab: str, c: str, where) -> dict[str, int]:
    """``merge_few`` for many words at once (``a != b``, so merge sites never overlap), in numpy.

    The touched words are joined by a separator into one code-point array; merge sites are the
    positions ``i`` with ``arr[i] == a, arr[i+1] == b``. Each site with left neighbour ``x`` and right
    neighbour ``y`` removes ``xa``/``by`` and adds ``xc``/``cy``; when the site two to the left is also
    one (``..a b a b..``), the pair between them is ``ba`` -> ``cc``, counted once, by the right site."""
    a, b, cc = ord(ab[0]), ord(ab[1]), ord(c)
    touched_np = np.sort(np.asarray(touched, dtype=np.int64))  # (T,) the index may repeat a word:
    touched_np = touched_np[
        np.concatenate(([True], touched_np[1:] != touched_np[:-1]))
    ]  # sort+dedup (numpy 2's np.unique hashes: ~25x slower)
    touched = touched_np.tolist()
    joined = SEP.join(itemgetter(*touched)(words) if len(touched) > 1 else [words[touched[0]]])
    list(map(words.__setitem__, touched, joined.replace(ab, c).split(SEP)))
    sep = ord(SEP)
    arr = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)  # (L,)
    pos = np.flatnonzero((arr[:-1] == a) & (arr[1:] == b))  # (S,) merge sites
    if not pos.size:
        return {}
    word_of = np.searchsorted(np.flatnonzero(arr == sep), pos)  # (S,) index into touched
    w = counts_np[touched_np[word_of]]  # (S,) weight of each site
    padded = np.concatenate(([sep], arr, [sep])).astype(np.uint32)  # padded[i + 1] == arr[i]
    x, y = padded[pos].astype(np.int64), padded[pos + 3].astype(np.int64)  # (S,) neighbours (sep: none)
    site = np.zeros(len(arr) + 4, dtype=bool)
    site[pos + 2] = True
    left_site, right_site = site[pos], site[pos + 4]  # (S,) another site two to the left / right
    has_x = (x != sep) & ~left_site
    has_y = (y != sep) & ~right_site
    n_ll = int(left_site.sum())
    sh = 21
    # removed pairs (weight -w) and added pairs (+w, and indexed in `where`)
    rem_keys = np.concatenate(((x[has_x] << sh) | a, (b << sh) | y[has_y], np.full(n_ll, (b << sh) | a)))
    add_keys = np.concatenate(((x[has_x] << sh) | cc, (cc << sh) | y[has_y], np.full(n_ll, (cc << sh) | cc)))
    site_w = np.concatenate((w[has_x], w[has_y], w[left_site]))
    uniq, inv = np.unique(np.concatenate((rem_keys, add_keys)), return_inverse=True)
    tot = np.rint(np.bincount(inv.ravel(), weights=np.concatenate((-site_w, site_w)))).astype(np.int64)  # exact < 2**53
    mask = (1 << sh) - 1
    delta = {chr(k >> sh) + chr(k & mask): d for k, d in zip(uniq.tolist(), tot.tolist())}
    if add_keys.size:
        add_word = touched_np[np.concatenate((word_of[has_x], word_of[has_y], word_of[left_site]))]
        order = np.argsort(add_keys, kind="stable")
        ks = add_keys[order]
        starts = np.flatnonzero(np.concatenate(([True], ks[1:] != ks[:-1])))
        bounds = starts.tolist() + [len(ks)]
        wb = add_word[order].astype(np.int32).tobytes()
        for g, k in enumerate(ks[starts].tolist()):
            where[chr(k >> sh) + chr(k & mask)].frombytes(wb[4 * bounds[g] : 4 * bounds[g + 1]])
    return delta


def apply_merge(words: list[str], counts: list[int], counts_np, touched, ab: str, c: str, where) -> dict[str, int]:
    """Merge the pair ``ab`` -> symbol ``c`` in the ``touched`` words (indices from ``where``); returns
    {pair: count change}. Many words (``VECTOR_MIN_WORDS``) and ``a != b``: in numpy; otherwise word by word."""
    if len(touched) >= VECTOR_MIN_WORDS and ab[0] != ab[1]:
        return merge_many(words, counts_np, touched, ab, c, where)
    return merge_few(words, counts, touched, ab, c, where)


def check_vocab_size(vocab_size: int, n_specials: int, alphabet_size: int, what: str) -> int:
    """Number of merges to learn; errors when the vocabulary cannot even hold the alphabet."""
    need = n_specials + alphabet_size
    if vocab_size < need:
        raise UserError(
            f"{what}: --vocab-size {vocab_size} is below the alphabet size ({alphabet_size} symbols "
            f"+ {n_specials} special tokens = {need}); raise it or lower the character coverage"
        )
    return vocab_size - need
