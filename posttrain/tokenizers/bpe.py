"""Byte-pair encoding: learn merges most-frequent-pair-first, encode by replaying merges by rank.

Key insight (Sennrich et al. 2016): start from characters and repeatedly merge the adjacent pair
that occurs most often in the corpus, ``best = argmax_{(a,b)} count(a, b)``; the ordered merge list
*is* the model. Encoding a word replays the merges, always applying the lowest-rank pair present.

Worked example (``end_of_word_suffix="</w>"`` glued to the last character, as in Hugging Face):
words ``low lower lowest`` -> ``[l,o,w</w>] [l,o,w,e,r</w>] [l,o,w,e,s,t</w>]``;
counts: (l,o)=3 -> merge ``lo``; then (lo,w)=2 ties (w,e)=2, the tie-break picks ``(lo,w)``;
then (low,e)=2 -> ``lowe``.

Tie-break (deterministic, independent of hash order): highest count, then the lexicographically
smallest ``(left string, right string)``. ``tokenizers`` breaks ties by internal ids that depend on
hash iteration order, so its merges can differ run to run; ours never do.

Training here works on a word-frequency table (the corpus collapsed by the pre-tokeniser):
``train_merges`` keeps pair counts incrementally, an index pair -> words containing it, and a lazy
max-heap, so one merge costs time proportional to the words it touches. Words are strings of symbol
characters (``chr(id)``), so a merge inside a word is ``str.replace``; a merge touching many words
runs in numpy over the joined words (``_merge_many``). ``train_merges_slow`` recounts every pair for
every merge and is the test oracle.

Cost on one long unbroken line (a single giant word): each merge visits a word once, however often it
holds the pair (the index lists a word once per occurrence; visiting it per entry was quadratic: 5 MB
took minutes), so a merge costs O(length of the words it touches) and training is linear in the corpus
for a fixed vocabulary, as in ``tokenizers``' trainer; nothing is cut, so results never depend on line
length. Given the trainers' ``log``, the merge loop reports progress on stderr (:mod:`posttrain.progress`).

Not handled: BPE dropout (``dropout`` in tokenizer.json must be null), ``continuing_subword_prefix``
when training (it is honoured when encoding a loaded file).
"""

from __future__ import annotations

import heapq
from array import array
from functools import partial
from operator import itemgetter
from dataclasses import dataclass
from collections import defaultdict

import numpy as np

from posttrain.errors import UserError
from posttrain.progress import counter_progress


def initial_symbols(word: str, suffix: str | None) -> list[str]:
    """"low" -> ["l", "o", "w</w>"] with suffix "</w>"; ["l", "o", "w"] without."""
    syms = list(word)
    if suffix and syms:
        syms[-1] = syms[-1] + suffix
    return syms


def initial_alphabet(word_counts, suffix: str | None) -> list[str]:
    """The sorted ``initial_symbols`` of every word, without a list per character (one 50 MB word)."""
    syms: set[str] = set()
    for w in word_counts:
        if w:
            syms.update(w[:-1] if suffix else w)
            if suffix:
                syms.add(w[-1] + suffix)
    return sorted(syms)


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
            out.extend(w[i:j + 1])
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


# ------------------------------------------------------------------------------------------------
# Training
# ------------------------------------------------------------------------------------------------
def _setup(word_counts: dict[str, int], suffix: str | None, alphabet: list[str] | None):
    syms = set()
    split = []
    for w, c in word_counts.items():
        s = initial_symbols(w, suffix)
        if s:
            split.append((s, c))
            syms.update(s)
    if alphabet is not None:
        syms.update(alphabet)
    id_to_str = sorted(syms)
    str_to_id = {s: i for i, s in enumerate(id_to_str)}
    words = [[str_to_id[s] for s in ws] for ws, _ in split]
    counts = [c for _, c in split]
    return words, counts, id_to_str, str_to_id


def encode_words(word_counts: dict[str, int], suffix: str | None, alphabet: list[str] | None):
    """Words as *strings of symbol ids*: symbol id ``i`` is the character ``chr(i)``.

    Then a merge is ``str.replace``, a pair is a 2-character string and a pair lookup is ``str.find``,
    all in C. {"low": 3, "lo": 1} with suffix "</w>" -> alphabet ["l", "o", "o</w>", "w</w>"],
    words ["\\x00\\x01\\x03", "\\x00\\x02"], counts [3, 1]. Returns (words, counts, id_to_str, str_to_id)."""
    suffix = suffix or None
    items = [(w, c) for w, c in word_counts.items() if w]
    if suffix is None:
        syms = set("".join(w for w, _ in items))
    else:
        syms = set("".join(w[:-1] for w, _ in items))
        syms.update(w[-1] + suffix for w, _ in items)
    if alphabet is not None:
        syms.update(alphabet)
    id_to_str = sorted(syms)
    str_to_id = {s: i for i, s in enumerate(id_to_str)}
    table = {ord(s): chr(i) for s, i in str_to_id.items() if len(s) == 1}
    if suffix is None:
        words = [w.translate(table) for w, _ in items]
    else:
        last = {s[:-len(suffix)]: chr(i) for s, i in str_to_id.items() if s.endswith(suffix) and len(s) == len(suffix) + 1}
        words = [w[:-1].translate(table) + last[w[-1]] for w, _ in items]
    counts = [c for _, c in items]
    return words, counts, id_to_str, str_to_id


def count_pairs(words: list[str], counts: list[int]):
    """Initial {pair: weighted count} and {pair: indices of the words holding it}; pairs are 2-char strings.

    Vectorised: all words joined by a separator into one code-point array, pair keys
    ``left << 21 | right``, grouped by one sort. ["ab", "abb"], counts [2, 1] -> {"ab": 3, "bb": 1},
    {"ab": [0, 1], "bb": [1]} (a word holding a pair twice is listed twice). The index lists are
    ``array('i')`` (4 bytes an entry, not a pointer plus an int object: a third of the memory)."""
    pc: dict[str, int] = {}
    where: dict[str, array] = defaultdict(_new_index)
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
        ix.frombytes(wb[4 * bounds[g]:4 * bounds[g + 1]])
    return pc, where


_new_index = partial(array, "i")


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
                removed.append(s[q:q + 2])
                last = q
        j = s.find(ab, j + 2)
    ns = s.replace(ab, c)
    m = len(ns)
    added: list[str] = []
    last = -1
    for k in sites:
        for q in (k - 1, k):
            if q > last and 0 <= q < m - 1:
                added.append(ns[q:q + 2])
                last = q
    return ns, removed, added



def train_merges_slow(word_counts: dict[str, int], n_merges: int, *, suffix: str | None = None,
                      min_frequency: int = 1, alphabet: list[str] | None = None):
    """Oracle: recount every pair before each merge until ``n_merges`` new tokens exist.

    Returns (alphabet, merges as string pairs); a merge whose result string already exists
    (("a", "bc") after ("ab", "c")) is recorded but adds no token."""
    words, counts, id_to_str, _ = _setup(word_counts, suffix, alphabet)
    words = [[id_to_str[i] for i in w] for w in words]
    merges = []
    known = set(id_to_str)
    n_new = 0
    while n_new < n_merges:
        pc: dict[tuple[str, str], int] = defaultdict(int)
        for w, c in zip(words, counts):
            for p in zip(w, w[1:]):
                pc[p] += c
        if not pc:
            break
        best = min(pc, key=lambda p: (-pc[p], p))
        if pc[best] < min_frequency:
            break
        a, b = best
        merges.append(best)
        if a + b not in known:
            known.add(a + b)
            n_new += 1
        words = [merge_ids(w, a, b, a + b) for w in words]
    return id_to_str, merges


def train_merges(word_counts: dict[str, int], n_merges: int, *, suffix: str | None = None,
                 min_frequency: int = 1, alphabet: list[str] | None = None, progress=None, log=None):
    """``_train_merges``; with ``log`` (a trainer's log callable) the merges' progress is shown on stderr
    (posttrain.progress: a bar on a terminal, a line every 10 % of the merges otherwise)."""
    with counter_progress(n_merges, "bpe: merges", unit="merge", enabled=log is not None) as report:
        if report is not None and progress is not None:
            report = (lambda k, f=report, g=progress: (f(k), g(k)))
        return _train_merges(word_counts, n_merges, suffix=suffix, min_frequency=min_frequency, alphabet=alphabet,
                             progress=report if report is not None else progress)


def _train_merges(word_counts: dict[str, int], n_merges: int, *, suffix: str | None = None,
                  min_frequency: int = 1, alphabet: list[str] | None = None, progress=None):
    """Fast BPE trainer: incremental pair counts + pair->words index + lazy max-heap.

    Returns (alphabet sorted, merges as (left, right) string pairs), identical to ``train_merges_slow``.
    Words are strings of symbol characters (``encode_words``), so finding and applying a merge in a
    word is ``str.find``/``str.replace``; a pair is a 2-character string. A merge touches only the
    words that contain its pair (``where``) and, when the pair occurs once in a word (the common
    case), only the two neighbouring pairs: ``x a b y -> x C y`` removes ``xa, by`` and adds
    ``xC, Cy``.

    The heap holds (-count, left, right, pair) and is lazy in both directions: a count increase pushes
    a fresh entry; a decrease pushes nothing, and an entry popped with a count above the pair's current
    one is pushed back with the current count. Every live pair thus always has an entry at or above
    its true count, so the first popped entry that matches its pair's count is the true argmax (ties:
    smallest (left, right) strings).
    """
    words, counts, id_to_str, str_to_id = encode_words(word_counts, suffix, alphabet)
    alphabet_out = list(id_to_str)
    if len(id_to_str) + n_merges >= 0x10FFFF:
        raise UserError(f"BPE training supports vocabularies below {0x10FFFF} tokens")
    pc, where = count_pairs(words, counts)
    counts_np = np.asarray(counts, dtype=np.int64)
    heap = [(-c, id_to_str[ord(p[0])], id_to_str[ord(p[1])], p) for p, c in pc.items()]
    heapq.heapify(heap)
    heappush, heappop = heapq.heappush, heapq.heappop
    merges: list[tuple[str, str]] = []
    n_new = 0
    while n_new < n_merges and heap:
        negc, sa, sb, ab = heappop(heap)
        cur = pc.get(ab, 0)
        if cur != -negc:
            if 0 < cur < -negc:
                heappush(heap, (-cur, sa, sb, ab))  # a stale, too-high entry: requeue at the true count
            continue
        if cur < min_frequency:
            break
        merges.append((sa, sb))
        new_str = sa + sb
        c_id = str_to_id.get(new_str)
        if c_id is None:
            c_id = len(id_to_str)
            id_to_str.append(new_str)
            str_to_id[new_str] = c_id
            n_new += 1
        a, b, c = ab[0], ab[1], chr(c_id)
        del pc[ab]  # every occurrence is merged, and a merge never re-creates `ab` (c differs from a, b)
        touched = where.pop(ab, ())
        if len(touched) >= VECTOR_MIN_WORDS and a != b:
            delta = _merge_many(words, counts_np, touched, ab, c, where)
        else:
            delta = _merge_few(words, counts, touched, ab, c, where)
        delta.pop(ab, None)
        for p, d in delta.items():
            if not d:
                continue
            v = pc.get(p, 0) + d
            if v > 0:
                pc[p] = v
                if d > 0:
                    heappush(heap, (-v, id_to_str[ord(p[0])], id_to_str[ord(p[1])], p))
            else:
                pc.pop(p, None)
                where.pop(p, None)
        if len(heap) > 2 * len(pc) + 65536:  # mostly stale entries: rebuild from the live counts (memory)
            heap = [(-v, id_to_str[ord(p[0])], id_to_str[ord(p[1])], p) for p, v in pc.items()]
            heapq.heapify(heap)
        if progress is not None:
            progress(len(merges))
    return alphabet_out, merges


VECTOR_MIN_WORDS = 64  # a merge touching at least this many words is applied with numpy (_merge_many)
_SEP = chr(0x10FFFF)  # never a symbol id (ids stay below it)


def _merge_few(words: list[str], counts: list[int], touched, ab: str, c: str, where) -> dict[str, int]:
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
            words[wi] = s[:j] + c + s[j + 2:]
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


def _merge_many(words: list[str], counts_np, touched, ab: str, c: str, where) -> dict[str, int]:
    """``_merge_few`` for many words at once (``a != b``, so merge sites never overlap), in numpy.

    The touched words are joined by a separator into one code-point array; merge sites are the
    positions ``i`` with ``arr[i] == a, arr[i+1] == b``. Each site with left neighbour ``x`` and right
    neighbour ``y`` removes ``xa``/``by`` and adds ``xc``/``cy``; when the site two to the left is also
    one (``..a b a b..``), the pair between them is ``ba`` -> ``cc``, counted once, by the right site."""
    a, b, cc = ord(ab[0]), ord(ab[1]), ord(c)
    touched_np = np.sort(np.asarray(touched, dtype=np.int64))  # (T,) the index may repeat a word:
    touched_np = touched_np[np.concatenate(([True], touched_np[1:] != touched_np[:-1]))]  # sort+dedup (numpy 2's np.unique hashes: ~25x slower)
    touched = touched_np.tolist()
    joined = _SEP.join(itemgetter(*touched)(words) if len(touched) > 1 else [words[touched[0]]])
    list(map(words.__setitem__, touched, joined.replace(ab, c).split(_SEP)))
    sep = ord(_SEP)
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
            where[chr(k >> sh) + chr(k & mask)].frombytes(wb[4 * bounds[g]:4 * bounds[g + 1]])
    return delta


def build_vocab(specials: list[str], alphabet: list[str], merges: list[tuple[str, str]], vocab_size: int) -> dict[str, int]:
    """specials, then the alphabet, then merge results in merge order (a repeated string keeps its first id)."""
    vocab: dict[str, int] = {}
    for t in list(specials) + list(alphabet) + [a + b for a, b in merges]:
        if t not in vocab:
            vocab[t] = len(vocab)
    return vocab


def check_vocab_size(vocab_size: int, n_specials: int, alphabet_size: int, what: str) -> int:
    """Number of merges to learn; errors when the vocabulary cannot even hold the alphabet."""
    need = n_specials + alphabet_size
    if vocab_size < need:
        raise UserError(f"{what}: --vocab-size {vocab_size} is below the alphabet size ({alphabet_size} symbols "
                        f"+ {n_specials} special tokens = {need}); raise it or lower the character coverage")
    return vocab_size - need


# ------------------------------------------------------------------------------------------------
# Encoding
# ------------------------------------------------------------------------------------------------
class BPEModel:
    """Encode a pre-tokenised word: characters (suffix on the last), then merges lowest-rank-first.

    ``ranks[(id_a, id_b)] = (rank, id_merged, id_a, id_b)``. A character missing from the vocabulary becomes its
    UTF-8 ``<0xNN>`` byte tokens (``byte_fallback``) or ``unk_token`` (consecutive unknowns fused with
    ``fuse_unk``); without either it is dropped, as in ``tokenizers``.
    """

    type = "BPE"

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], *, unk_token: str | None = None,
                 end_of_word_suffix: str | None = None, continuing_subword_prefix: str | None = None,
                 byte_fallback: bool = False, fuse_unk: bool = False, ignore_merges: bool = False):
        self.vocab = vocab
        self.merges = [tuple(m) for m in merges]
        self.unk_token, self.suffix, self.prefix = unk_token, end_of_word_suffix, continuing_subword_prefix
        self.byte_fallback, self.fuse_unk, self.ignore_merges = byte_fallback, fuse_unk, ignore_merges
        self.unk_id = vocab.get(unk_token) if unk_token is not None else None
        if unk_token is not None and self.unk_id is None:
            raise UserError(f"BPE unk_token {unk_token!r} is not in the vocabulary")
        self.ranks: dict[tuple[int, int], tuple[int, int, int, int]] = {}  # (a, b) -> (rank, merged, a, b)
        plen = len(self.prefix) if self.prefix else 0
        for r, (a, b) in enumerate(self.merges):
            ia, ib = vocab.get(a), vocab.get(b)
            new = a + (b[plen:] if plen and b.startswith(self.prefix) else b)
            inew = vocab.get(new)
            if ia is None or ib is None or inew is None:
                raise UserError(f"BPE merge {a!r} {b!r} uses a token missing from the vocabulary")
            if (ia, ib) not in self.ranks:
                self.ranks[(ia, ib)] = (r, inew, ia, ib)

    def tokenize(self, word: str) -> list[int]:
        vocab = self.vocab
        if self.ignore_merges:
            i = vocab.get(word)
            if i is not None:
                return [i]
        ids: list[int] = []
        n = len(word)
        last_unk = False
        for k, ch in enumerate(word):
            s = ch
            if self.prefix and k > 0:
                s = self.prefix + s
            if self.suffix and k == n - 1:
                s = s + self.suffix
            i = vocab.get(s)
            if i is not None:
                ids.append(i)
                last_unk = False
                continue
            if self.byte_fallback:
                bts = [vocab.get(f"<0x{b:02X}>") for b in s.encode("utf-8", "surrogatepass")]
                if all(x is not None for x in bts):
                    ids.extend(bts)  # type: ignore[arg-type]
                    last_unk = False
                    continue
            if self.unk_id is not None:
                if not (self.fuse_unk and last_unk):
                    ids.append(self.unk_id)
                last_unk = True
        return self.apply_merges(ids)

    def apply_merges(self, ids: list[int]) -> list[int]:
        """Repeatedly merge every occurrence of the lowest-rank adjacent pair (equivalent to tokenizers'
        one-at-a-time leftmost-lowest-rank loop: a merge's result only ever forms higher-rank pairs)."""
        get = self.ranks.get
        while len(ids) >= 2:
            cands = [r for r in map(get, zip(ids, ids[1:])) if r is not None]
            if not cands:
                break
            _, new, a, b = min(cands)
            ids = merge_ids(ids, a, b, new)
        return ids

    def to_json(self) -> dict:
        return {"type": "BPE", "dropout": None, "unk_token": self.unk_token,
                "continuing_subword_prefix": self.prefix, "end_of_word_suffix": self.suffix,
                "fuse_unk": self.fuse_unk, "byte_fallback": self.byte_fallback, "ignore_merges": self.ignore_merges,
                "vocab": self.vocab, "merges": [list(m) for m in self.merges]}

    @classmethod
    def from_json(cls, d: dict) -> "BPEModel":
        if d.get("dropout") not in (None, 0, 0.0):
            raise UserError("BPE dropout is not supported (tokenizer.json has dropout set)")
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in d.get("merges", [])]
        return cls(d["vocab"], merges, unk_token=d.get("unk_token"), end_of_word_suffix=d.get("end_of_word_suffix"),
                   continuing_subword_prefix=d.get("continuing_subword_prefix"),
                   byte_fallback=bool(d.get("byte_fallback", False)), fuse_unk=bool(d.get("fuse_unk", False)),
                   ignore_merges=bool(d.get("ignore_merges", False)))


# ------------------------------------------------------------------------------------------------
# Trainer: text -> SubwordTokenizer
# ------------------------------------------------------------------------------------------------
def special_added_tokens(specials) -> list[dict]:
    """Special tokens take ids 0..k-1 (as ``tokenizers`` trainers do) and are never split."""
    if len(set(specials)) != len(specials):
        raise UserError(f"repeated special tokens: {list(specials)}")
    return [{"id": i, "content": t, "special": True} for i, t in enumerate(specials)]


@dataclass
class BPETrainer:
    """Classic BPE: ``Whitespace`` pre-tokenisation (``\\w+|[^\\w\\s]+``), ``</w>`` glued to each word's
    last character, optional lower-casing; unseen characters -> ``<unk>`` (or ``<0xNN>`` bytes with
    ``byte_fallback``)."""

    vocab_size: int = 8000
    special_tokens: tuple[str, ...] = ("<pad>", "<unk>", "<bos>", "<eos>")
    min_frequency: int = 1
    lowercase: bool = False
    end_of_word_suffix: str = "</w>"
    unk_token: str | None = "<unk>"
    byte_fallback: bool = False
    workers: int | None = None

    kind = "bpe"
    keep_bytes = False
    keep_newlines = False

    def components(self):
        from posttrain.tokenizers import pretokenize as P

        return (P.Lowercase() if self.lowercase else None), P.Whitespace(), P.BPEDecoder(self.end_of_word_suffix)

    def words_fn(self):
        """Whitespace words never hold or look at whitespace (and lower-casing is per character, with
        final sigma decided by letters only), so a batch joined by newlines is split in one pass."""
        from posttrain.tokenizers.corpus import JoinedWords

        norm, pre, _ = self.components()
        fn = (lambda t: pre(norm(t))) if norm is not None else pre
        return JoinedWords(fn, fn, sep="\n")

    def train(self, texts, log=None):
        from posttrain.tokenizers.corpus import count_words

        return self.train_from_counts(count_words(texts, self.words_fn(), workers=self.workers), log=log)

    def train_from_counts(self, word_counts: dict[str, int], log=None):
        from posttrain.tokenizers.pipeline import SubwordTokenizer

        specials = list(self.special_tokens)
        if self.unk_token is not None and self.unk_token not in specials:
            specials.append(self.unk_token)
        if not word_counts:
            raise UserError("cannot train BPE on an empty corpus")
        extra = BYTE_TOKENS if self.byte_fallback else []
        alphabet = initial_alphabet(word_counts, self.end_of_word_suffix)
        n = check_vocab_size(self.vocab_size, len(specials) + len(extra), len(alphabet), "bpe")
        alphabet, merges = train_merges(word_counts, n, suffix=self.end_of_word_suffix,
                                        min_frequency=self.min_frequency, log=log)
        vocab = build_vocab(specials + extra, alphabet, merges, self.vocab_size)
        model = BPEModel(vocab, merges, unk_token=self.unk_token, end_of_word_suffix=self.end_of_word_suffix,
                         byte_fallback=self.byte_fallback)
        norm, pre, dec = self.components()
        if self.byte_fallback:
            from posttrain.tokenizers import pretokenize as P

            dec = P.DecoderSequence([P.ByteFallbackDecoder(), dec])
        if log:
            log(f"bpe: {len(word_counts)} distinct words, {len(alphabet)} symbols, {len(merges)} merges")
        return SubwordTokenizer(model, normalizer=norm, pre_tokenizer=pre, decoder=dec,
                                added_tokens=special_added_tokens(specials), kind=self.kind)


BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
