"""WordPiece (BERT): merge the pair with the highest likelihood gain, encode by greedy longest prefix.

Key insight (Schuster & Nakajima 2012; the notes' "互信息" criterion): merge
``argmax_{(a,b)} count(a,b) / (count(a) * count(b))`` — the pair whose parts occur together far more
often than chance, not merely the most frequent pair (that is BPE; Hugging Face's WordPiece trainer
in fact merges by raw frequency). Word-internal pieces carry the ``##`` prefix:
``"unaffable" -> ["un", "##aff", "##able"]``; merging ``"un"`` + ``"##aff"`` gives ``"unaff"``, and
``"##aff"`` + ``"##able"`` gives ``"##affable"``.

Encoding a word: take the longest vocabulary entry that prefixes the rest of the word (``##`` form
after the first piece), repeat; if some position has no match, the whole word is ``[UNK]``, as is a
word longer than ``max_input_chars_per_word`` characters.

``criterion="likelihood"`` instead merges by the corpus likelihood gain of a unigram model over the
symbols, ``count(a,b) * log(N * count(a,b) / (count(a) * count(b)))`` with N the initial number of
symbols: the same association, weighted by how often the pair occurs. The plain ratio is largest
for rare pairs that always occur together (a pair seen twice, of symbols seen twice, scores 0.5;
"t" + "##h" in English text ~1e-7), so on a real corpus its merges go to rare fragments and common
words stay in pieces; the weighted gain gives a vocabulary that compresses like a frequency-merged one.

Tie-break: highest score, then lexicographically smallest (left, right). ``train_wordpiece_merges``
keeps pair and symbol counts incrementally and rescores only pairs whose count or whose parts'
counts changed (a numpy array of scores, argmax per merge); ``train_wordpiece_merges_slow`` recounts
everything per merge and is its oracle.

Not handled: training from a pre-existing vocabulary, ``limit_alphabet`` beyond keeping the most
frequent characters.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from posttrain.errors import UserError
from posttrain.tokenizers.corpus import JoinedWords, count_words
from posttrain.tokenizers.decoders import WordPieceDecoder
from posttrain.tokenizers.merges import apply_merge, check_vocab_size, count_pairs, merge_ids
from posttrain.tokenizers.normalizers import BertNormalizer
from posttrain.tokenizers.pipeline import SubwordTokenizer, TextToWords, special_added_tokens
from posttrain.tokenizers.pre_tokenizers import BertPreTokenizer
from posttrain.tokenizers.symbols import bert_regexes

PREFIX = "##"


def word_symbols(word: str, prefix: str = PREFIX) -> list[str]:
    """ "low" -> ["l", "##o", "##w"]."""
    return [c if i == 0 else prefix + c for i, c in enumerate(word)]


def merged(a: str, b: str, prefix: str = PREFIX) -> str:
    """("un", "##aff") -> "unaff"; ("##aff", "##able") -> "##affable"."""
    return a + (b[len(prefix) :] if b.startswith(prefix) else b)


CRITERIA = ("score", "likelihood")


def pair_scores(c: np.ndarray, ca: np.ndarray, cb: np.ndarray, criterion: str, n0: float) -> np.ndarray:
    """Merge score of pairs with count ``c`` whose parts have counts ``ca``, ``cb`` (float64 arrays):
    ``c / (ca cb)`` ("score") or ``c log(n0 c / (ca cb))`` ("likelihood", n0 = the initial symbol count)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = c / (ca * cb)
        return ratio if criterion == "score" else c * np.log(ratio * n0)


def _check_criterion(criterion: str) -> None:
    if criterion not in CRITERIA:
        raise UserError(f"unknown WordPiece criterion {criterion!r}; expected one of {', '.join(CRITERIA)}")


def train_wordpiece_merges_slow(
    word_counts: dict[str, int], n_merges: int, min_frequency: int = 1, criterion: str = "score"
):
    """Oracle: recount pair and symbol counts before each merge. Returns (alphabet, merged tokens)."""
    _check_criterion(criterion)
    words = [word_symbols(w) for w in word_counts if w]
    counts = [c for w, c in word_counts.items() if w]
    n0 = float(sum(len(w) * c for w, c in zip(words, counts)))
    alphabet = sorted({s for w in words for s in w})
    out = []
    known, n_new = set(alphabet), 0
    while n_new < n_merges:
        pc: dict = defaultdict(int)
        sc: dict = defaultdict(int)
        for w, c in zip(words, counts):
            for s in w:
                sc[s] += c
            for p in zip(w, w[1:]):
                pc[p] += c
        pc = {p: c for p, c in pc.items() if c >= min_frequency}
        if not pc:
            break
        pairs = list(pc)
        score = pair_scores(
            np.array([pc[p] for p in pairs], dtype=np.float64),
            np.array([sc[p[0]] for p in pairs], dtype=np.float64),
            np.array([sc[p[1]] for p in pairs], dtype=np.float64),
            criterion,
            n0,
        ).tolist()
        best = min(zip(pairs, score), key=lambda t: (-t[1], t[0]))[0]
        a, b = best
        new = merged(a, b)
        out.append((a, b, new))
        if new not in known:
            known.add(new)
            n_new += 1
        words = [merge_ids(w, a, b, new) for w in words]
    return alphabet, out


def train_wordpiece_merges(
    word_counts: dict[str, int], n_merges: int, min_frequency: int = 1, progress=None, criterion: str = "score"
):
    """Fast trainer; same result as ``train_wordpiece_merges_slow``. Returns (alphabet, [(a, b, merged)]).

    Words are strings of symbol characters and merges are applied by the engine BPE shares
    (:func:`merges.apply_merge`, in numpy when a merge touches many words), with its pair -> words index.
    Every pair also has a slot in numpy arrays (left id, right id, count, score). A merge (a, b) -> c
    changes the counts of the pairs around its sites and the symbol counts of a, b and c, so it
    rescores, in one vectorised step, the changed pairs and every pair that holds a, b or c
    (``sym_pairs``: symbol -> its pairs' slots). argmax picks the best score; ties (common: many rare
    pairs score exactly 1/(count(a)count(b))) go to the smallest left string, then right string."""
    _check_criterion(criterion)
    alphabet, id_to_str, str_to_id, words, counts = _symbol_words(word_counts, n_merges)
    counts_np = np.asarray(counts, dtype=np.int64)
    symc = _symbol_counts(words, counts_np, max(16, 2 * (len(id_to_str) + n_merges)))
    pc, where = count_pairs(words, counts)  # pair (2-char string) -> count, and -> indices of its words
    table = _PairTable(pc, criterion, float(symc.sum()), max(min_frequency, 1))
    del pc
    table.rescore(np.arange(len(table.pa)), symc)
    key = id_to_str.__getitem__
    out = []
    n_new = 0
    while n_new < n_merges:
        best = table.best(key)
        if best is None:
            break
        a, b = table.pa[best], table.pb[best]
        new = merged(id_to_str[a], id_to_str[b])
        c_id = str_to_id.get(new)
        if c_id is None:
            c_id = len(id_to_str)
            id_to_str.append(new)
            str_to_id[new] = c_id
            n_new += 1
            if c_id >= len(symc):
                symc = np.concatenate([symc, np.zeros(len(symc))])
        out.append((id_to_str[a], id_to_str[b], new))
        delta, n_merged = _merge_in_words(words, counts, counts_np, where, a, b, c_id, table.cnt[best])
        symc[a] -= n_merged
        symc[b] -= n_merged
        symc[c_id] += n_merged
        changed = table.apply_delta(delta, best, where)
        # pairs whose count changed, and every pair holding a symbol whose count changed (a, b and c: c
        # may already have existed, spelt by another merge)
        table.rescore(
            np.concatenate(
                [changed, [best]] + [np.asarray(table.sym_pairs.get(x, ()), dtype=np.int64) for x in (a, b, c_id)]
            ),
            symc,
        )
        if progress is not None:
            progress(len(out))
    return alphabet, out


def _symbol_words(word_counts: dict[str, int], n_merges: int):
    """(alphabet, id_to_str, str_to_id, words as strings of symbol characters, counts): symbol id i = chr(i)."""
    split = [(word_symbols(w), c) for w, c in word_counts.items() if w]
    alphabet = sorted({s for w, _ in split for s in w})
    id_to_str = list(alphabet)
    str_to_id = {s: i for i, s in enumerate(id_to_str)}
    if len(id_to_str) + n_merges >= 0x10FFFF:
        raise UserError(f"WordPiece training supports vocabularies below {0x10FFFF} tokens")
    words = ["".join(chr(str_to_id[s]) for s in w) for w, _ in split]
    return alphabet, id_to_str, str_to_id, words, [c for _, c in split]


def _symbol_counts(words: list[str], counts_np: np.ndarray, cap: int) -> np.ndarray:
    """(cap,) float64 weighted count of every symbol id (one bincount over the joined words)."""
    symc = np.zeros(cap, dtype=np.float64)
    if words:
        codes = np.frombuffer("".join(words).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
        sc0 = np.bincount(codes, weights=np.repeat(counts_np.astype(np.float64), lengths))
        symc[: sc0.size] = sc0
    return symc


def _merge_in_words(words, counts, counts_np, where, a: int, b: int, c_id: int, pair_count: float):
    """Merge (a, b) -> c_id in every word holding it: ({pair: count change}, number of merges made)."""
    ab, c = chr(a) + chr(b), chr(c_id)
    touched = where.pop(ab, ())
    if a == b:  # runs "aaa" merge left to right: count the merges from the words' lengths
        uniq = sorted(set(touched))
        before = [len(words[wi]) for wi in uniq]
    delta = apply_merge(words, counts, counts_np, touched, ab, c, where)
    # every occurrence of ab is merged: for a != b the merges are the pair's count
    n_merged = sum((n - len(words[wi])) * counts[wi] for wi, n in zip(uniq, before)) if a == b else pair_count
    return delta, n_merged


class _PairTable:
    """Every pair a slot: left and right symbol ids, count and score in numpy arrays (grown by doubling),
    and symbol -> the slots of the pairs holding it (``sym_pairs``), so a merge rescores only what it changed."""

    def __init__(self, pair_counts: dict[str, int], criterion: str, n0: float, min_count: int):
        self.criterion, self.n0, self.min_count = criterion, n0, min_count
        self.slot_of: dict[str, int] = {}
        self.pa: list[int] = []
        self.pb: list[int] = []
        self.sym_pairs: dict[int, list[int]] = defaultdict(list)
        init = [(self.slot(p), c) for p, c in pair_counts.items()]
        cap = max(1024, 2 * len(self.pa))
        self.scores = np.full(cap, -np.inf)
        self.pa_np = np.zeros(cap, dtype=np.int64)
        self.pb_np = np.zeros(cap, dtype=np.int64)
        self.cnt = np.zeros(cap, dtype=np.float64)
        self.synced = 0  # slots [0, synced) have pa_np/pb_np filled
        self.sync()
        if init:
            ks = np.fromiter((k for k, _ in init), dtype=np.int64, count=len(init))
            self.cnt[ks] = np.fromiter((c for _, c in init), dtype=np.float64, count=len(init))

    def slot(self, p: str) -> int:
        s = self.slot_of.get(p)
        if s is None:
            s = len(self.pa)
            self.slot_of[p] = s
            x, y = ord(p[0]), ord(p[1])
            self.pa.append(x)
            self.pb.append(y)
            self.sym_pairs[x].append(s)
            if y != x:
                self.sym_pairs[y].append(s)
        return s

    def sync(self) -> None:
        """Grow the arrays to hold every slot, and copy the new slots' symbols into them."""
        n, cap = len(self.pa), self.scores.size
        if n > cap:
            extra = 2 * n - cap
            self.scores = np.concatenate([self.scores, np.full(extra, -np.inf)])
            self.pa_np = np.concatenate([self.pa_np, np.zeros(extra, dtype=np.int64)])
            self.pb_np = np.concatenate([self.pb_np, np.zeros(extra, dtype=np.int64)])
            self.cnt = np.concatenate([self.cnt, np.zeros(extra)])
        self.pa_np[self.synced : n] = self.pa[self.synced :]
        self.pb_np[self.synced : n] = self.pb[self.synced :]
        self.synced = n

    def rescore(self, idx: np.ndarray, symc: np.ndarray) -> None:
        c = self.cnt[idx]  # (k,)
        sc = pair_scores(c, symc[self.pa_np[idx]], symc[self.pb_np[idx]], self.criterion, self.n0)  # as the oracle
        sc[c < self.min_count] = -np.inf
        self.scores[idx] = sc

    def best(self, key) -> int | None:
        """The slot of the best score (None if no pair qualifies); ties (common: many rare pairs score exactly
        1/(count(a)count(b))) go to the smallest left string, then right string, without a key per slot."""
        best = int(np.argmax(self.scores))
        top = self.scores[best]
        if top == -np.inf:
            return None
        cand = np.flatnonzero(self.scores == top)
        if cand.size > 1:
            a_min = min(np.unique(self.pa_np[cand]).tolist(), key=key)
            cand = cand[self.pa_np[cand] == a_min]
            b_min = min(np.unique(self.pb_np[cand]).tolist(), key=key)
            best = int(cand[self.pb_np[cand] == b_min][0])
        return best

    def apply_delta(self, delta: dict[str, int], merged_slot: int, where) -> np.ndarray:
        """Add a merge's pair-count changes; returns the changed slots. The merged pair's count drops to 0
        (all merged, and a merge never re-creates it: c differs from a and b); pairs that vanished lose
        their word index."""
        changed = [(self.slot(p), d) for p, d in delta.items() if d]
        self.sync()
        self.cnt[merged_slot] = 0.0
        if not changed:
            return np.zeros(0, dtype=np.int64)
        ks = np.fromiter((k for k, _ in changed), dtype=np.int64, count=len(changed))
        self.cnt[ks] += np.fromiter((d for _, d in changed), dtype=np.float64, count=len(changed))
        for k in ks[self.cnt[ks] <= 0].tolist():
            where.pop(chr(self.pa[k]) + chr(self.pb[k]), None)
        return ks


class WordPieceModel:
    """Greedy longest-prefix encoder: "unaffable" -> ["un", "##aff", "##able"]; unmatchable -> [UNK]."""

    type = "WordPiece"

    def __init__(
        self,
        vocab: dict[str, int],
        unk_token: str = "[UNK]",
        continuing_subword_prefix: str = PREFIX,
        max_input_chars_per_word: int = 100,
    ):
        self.vocab, self.unk_token, self.prefix = vocab, unk_token, continuing_subword_prefix
        self.max_chars = max_input_chars_per_word
        if unk_token not in vocab:
            raise UserError(f"WordPiece unk_token {unk_token!r} is not in the vocabulary")
        self.unk_id = vocab[unk_token]
        self.max_len = max((len(t) for t in vocab), default=1)

    def tokenize(self, word: str) -> list[int]:
        n = len(word)
        if n > self.max_chars:
            return [self.unk_id]
        vocab, prefix, out, start = self.vocab, self.prefix, [], 0
        while start < n:
            end = min(n, start + self.max_len)
            hit = None
            while start < end:
                sub = word[start:end]
                if start > 0:
                    sub = prefix + sub
                hit = vocab.get(sub)
                if hit is not None:
                    break
                end -= 1
            if hit is None:
                return [self.unk_id]
            out.append(hit)
            start = end
        return out

    def to_json(self) -> dict:
        return {
            "type": "WordPiece",
            "unk_token": self.unk_token,
            "continuing_subword_prefix": self.prefix,
            "max_input_chars_per_word": self.max_chars,
            "vocab": self.vocab,
        }

    @classmethod
    def from_json(cls, d: dict) -> "WordPieceModel":
        return cls(
            d["vocab"],
            d.get("unk_token", "[UNK]"),
            d.get("continuing_subword_prefix", PREFIX),
            int(d.get("max_input_chars_per_word", 100)),
        )


@dataclass
class WordPieceTrainer:
    """BERT-style WordPiece: BertNormalizer (clean, CJK split, optional lower-case + accent strip),
    BertPreTokenizer, merges by count(ab)/(count(a)count(b)) (or, ``criterion="likelihood"``, by the
    likelihood gain), ``##`` continuation, ``[UNK]``."""

    vocab_size: int = 8000
    special_tokens: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    min_frequency: int = 1
    lowercase: bool = True
    strip_accents: bool | None = None
    unk_token: str = "[UNK]"
    max_input_chars_per_word: int = 100
    limit_alphabet: int | None = None
    criterion: str = "score"
    workers: int | None = None

    kind = "wordpiece"
    keep_bytes = False
    keep_newlines = False

    def components(self):
        norm = BertNormalizer(True, True, self.strip_accents, self.lowercase)
        return norm, BertPreTokenizer(), WordPieceDecoder(PREFIX, True)

    def words_fn(self):
        norm, pre, _ = self.components()
        bert_regexes()  # build once here, before the counting workers fork
        # every BERT rule is per character (NFD never reorders across a newline; final sigma sees the
        # newline, turned into a space, as a word end), so a batch joined by newlines splits the same
        fn = TextToWords(norm, pre)
        return JoinedWords(fn, fn, sep="\n")

    def train(self, texts, log=None):
        return self.train_from_counts(count_words(texts, self.words_fn(), workers=self.workers), log=log)

    def train_from_counts(self, word_counts: dict[str, int], log=None):
        _check_criterion(self.criterion)
        specials = list(self.special_tokens)
        if self.unk_token not in specials:
            specials.append(self.unk_token)
        wc = {w: c for w, c in word_counts.items() if 0 < len(w) <= self.max_input_chars_per_word}
        if not wc:
            if any(len(w) > self.max_input_chars_per_word for w in word_counts):
                longest = max(map(len, word_counts))
                raise UserError(
                    f"cannot train WordPiece: every word is longer than max_input_chars_per_word="
                    f"{self.max_input_chars_per_word} (the longest has {longest} characters), and such "
                    f"words encode to {self.unk_token}; split the text into shorter words (the limit is "
                    f"WordPieceTrainer(max_input_chars_per_word=...) in Python)"
                )
            raise UserError("cannot train WordPiece on an empty corpus")
        if self.limit_alphabet is not None:
            cc: dict[str, int] = defaultdict(int)
            for w, c in wc.items():
                for ch in w:
                    cc[ch] += c
            keep = {ch for ch, _ in sorted(cc.items(), key=lambda t: (-t[1], t[0]))[: self.limit_alphabet]}
            wc = {w: c for w, c in wc.items() if all(ch in keep for ch in w)}
        alphabet = sorted({s for w in wc for s in word_symbols(w)})
        n = check_vocab_size(self.vocab_size, len(specials), len(alphabet), "wordpiece")
        alphabet, merges = train_wordpiece_merges(wc, n, self.min_frequency, criterion=self.criterion)
        vocab: dict[str, int] = {}
        for t in specials + alphabet + [m for _, _, m in merges]:
            vocab.setdefault(t, len(vocab))
        if log:
            log(f"wordpiece: {len(wc)} distinct words, {len(alphabet)} symbols, {len(merges)} merges")
        norm, pre, dec = self.components()
        model = WordPieceModel(vocab, self.unk_token, PREFIX, self.max_input_chars_per_word)
        return SubwordTokenizer(
            model,
            normalizer=norm,
            pre_tokenizer=pre,
            decoder=dec,
            added_tokens=special_added_tokens(specials),
            kind=self.kind,
        )
