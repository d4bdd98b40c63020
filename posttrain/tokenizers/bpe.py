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
runs in numpy over the joined words (:mod:`merges`, the engine WordPiece shares). ``train_merges_slow``
recounts every pair for every merge and is the test oracle.

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
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from posttrain.errors import UserError
from posttrain.progress import counter_progress
from posttrain.tokenizers.corpus import JoinedWords, count_words
from posttrain.tokenizers.decoders import BPEDecoder, ByteFallbackDecoder, DecoderSequence
from posttrain.tokenizers.merges import apply_merge, check_vocab_size, count_pairs, merge_ids
from posttrain.tokenizers.normalizers import Lowercase
from posttrain.tokenizers.pipeline import SubwordTokenizer, special_added_tokens
from posttrain.tokenizers.pre_tokenizers import Whitespace
from posttrain.tokenizers.symbols import BYTE_TOKENS


def initial_symbols(word: str, suffix: str | None) -> list[str]:
    """ "low" -> ["l", "o", "w</w>"] with suffix "</w>"; ["l", "o", "w"] without."""
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
        last = {
            s[: -len(suffix)]: chr(i) for s, i in str_to_id.items() if s.endswith(suffix) and len(s) == len(suffix) + 1
        }
        words = [w[:-1].translate(table) + last[w[-1]] for w, _ in items]
    counts = [c for _, c in items]
    return words, counts, id_to_str, str_to_id


def train_merges_slow(
    word_counts: dict[str, int],
    n_merges: int,
    *,
    suffix: str | None = None,
    min_frequency: int = 1,
    alphabet: list[str] | None = None,
):
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


def train_merges(
    word_counts: dict[str, int],
    n_merges: int,
    *,
    suffix: str | None = None,
    min_frequency: int = 1,
    alphabet: list[str] | None = None,
    progress=None,
    log=None,
):
    """``_train_merges``; with ``log`` (a trainer's log callable) the merges' progress is shown on stderr
    (posttrain.progress: a bar on a terminal, a line every 10 % of the merges otherwise)."""
    with counter_progress(n_merges, "bpe: merges", unit="merge", enabled=log is not None) as report:
        if report is not None and progress is not None:
            report = lambda k, f=report, g=progress: (f(k), g(k))
        return _train_merges(
            word_counts,
            n_merges,
            suffix=suffix,
            min_frequency=min_frequency,
            alphabet=alphabet,
            progress=report if report is not None else progress,
        )


def _train_merges(
    word_counts: dict[str, int],
    n_merges: int,
    *,
    suffix: str | None = None,
    min_frequency: int = 1,
    alphabet: list[str] | None = None,
    progress=None,
):
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
        c = chr(c_id)
        del pc[ab]  # every occurrence is merged, and a merge never re-creates `ab` (c differs from a, b)
        delta = apply_merge(words, counts, counts_np, where.pop(ab, ()), ab, c, where)
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


def build_vocab(
    specials: list[str], alphabet: list[str], merges: list[tuple[str, str]], vocab_size: int
) -> dict[str, int]:
    """specials, then the alphabet, then merge results in merge order (a repeated string keeps its first id)."""
    vocab: dict[str, int] = {}
    for t in list(specials) + list(alphabet) + [a + b for a, b in merges]:
        if t not in vocab:
            vocab[t] = len(vocab)
    return vocab


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

    def __init__(
        self,
        vocab: dict[str, int],
        merges: list[tuple[str, str]],
        *,
        unk_token: str | None = None,
        end_of_word_suffix: str | None = None,
        continuing_subword_prefix: str | None = None,
        byte_fallback: bool = False,
        fuse_unk: bool = False,
        ignore_merges: bool = False,
    ):
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
                bts = [vocab.get(BYTE_TOKENS[b]) for b in s.encode("utf-8", "surrogatepass")]
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
        return {
            "type": "BPE",
            "dropout": None,
            "unk_token": self.unk_token,
            "continuing_subword_prefix": self.prefix,
            "end_of_word_suffix": self.suffix,
            "fuse_unk": self.fuse_unk,
            "byte_fallback": self.byte_fallback,
            "ignore_merges": self.ignore_merges,
            "vocab": self.vocab,
            "merges": [list(m) for m in self.merges],
        }

    @classmethod
    def from_json(cls, d: dict) -> "BPEModel":
        if d.get("dropout") not in (None, 0, 0.0):
            raise UserError("BPE dropout is not supported (tokenizer.json has dropout set)")
        merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in d.get("merges", [])]
        return cls(
            d["vocab"],
            merges,
            unk_token=d.get("unk_token"),
            end_of_word_suffix=d.get("end_of_word_suffix"),
            continuing_subword_prefix=d.get("continuing_subword_prefix"),
            byte_fallback=bool(d.get("byte_fallback", False)),
            fuse_unk=bool(d.get("fuse_unk", False)),
            ignore_merges=bool(d.get("ignore_merges", False)),
        )


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
        return (Lowercase() if self.lowercase else None), Whitespace(), BPEDecoder(self.end_of_word_suffix)

    def words_fn(self):
        """Whitespace words never hold or look at whitespace (and lower-casing is per character, with
        final sigma decided by letters only), so a batch joined by newlines is split in one pass."""
        norm, pre, _ = self.components()
        fn = (lambda t: pre(norm(t))) if norm is not None else pre
        return JoinedWords(fn, fn, sep="\n")

    def train(self, texts, log=None):
        return self.train_from_counts(count_words(texts, self.words_fn(), workers=self.workers), log=log)

    def train_from_counts(self, word_counts: dict[str, int], log=None):
        specials = list(self.special_tokens)
        if self.unk_token is not None and self.unk_token not in specials:
            specials.append(self.unk_token)
        if not word_counts:
            raise UserError("cannot train BPE on an empty corpus")
        extra = BYTE_TOKENS if self.byte_fallback else []
        alphabet = initial_alphabet(word_counts, self.end_of_word_suffix)
        n = check_vocab_size(self.vocab_size, len(specials) + len(extra), len(alphabet), "bpe")
        alphabet, merges = train_merges(
            word_counts, n, suffix=self.end_of_word_suffix, min_frequency=self.min_frequency, log=log
        )
        vocab = build_vocab(specials + extra, alphabet, merges, self.vocab_size)
        model = BPEModel(
            vocab,
            merges,
            unk_token=self.unk_token,
            end_of_word_suffix=self.end_of_word_suffix,
            byte_fallback=self.byte_fallback,
        )
        norm, pre, dec = self.components()
        if self.byte_fallback:
            dec = DecoderSequence([ByteFallbackDecoder(), dec])
        if log:
            log(f"bpe: {len(word_counts)} distinct words, {len(alphabet)} symbols, {len(merges)} merges")
        return SubwordTokenizer(
            model,
            normalizer=norm,
            pre_tokenizer=pre,
            decoder=dec,
            added_tokens=special_added_tokens(specials),
            kind=self.kind,
        )
