"""Unigram encoding: Viterbi over a word's lattice of pieces, and subword-regularised sampling.

Key insight: a word's probability is a sum over its segmentations, ``P(x) = sum_{s in S(x)} prod_i p(s_i)``;
the encoder takes the best one. Viterbi: ``best[e] = max_{b<e, x[b:e] in V} best[b] + log p(x[b:e])``
(ties: longest last piece, as in ``tokenizers``), computed by forward pushes over a prefix table (a trie
flattened into one dict); a character not in the vocabulary becomes ``<unk>`` with score
``min_score - 10`` (consecutive ones fused) or, with ``byte_fallback``, its UTF-8 ``<0xNN>`` pieces.
Subword regularisation: ``sample`` draws a segmentation with probability ``∝ P(s)^alpha`` by
forward-filtering backward-sampling. ``viterbi_slow`` (whole lattice, then relax) is the oracle of the
fast path and of its tie rule.

Not handled: n-best encoding.
"""

from __future__ import annotations

import math
import random

from posttrain.errors import UserError
from posttrain.tokenizers.symbols import BYTE_TOKENS

UNK_PENALTY = 10.0


class UnigramModel:
    """``pieces`` = [(piece, log_prob)] in id order; ``unk_id`` indexes the unknown piece."""

    type = "Unigram"

    def __init__(self, pieces: list[tuple[str, float]], unk_id: int | None = 0, byte_fallback: bool = False):
        self.pieces = [(p, float(s)) for p, s in pieces]
        self.vocab = {}
        for i, (p, _) in enumerate(self.pieces):
            self.vocab.setdefault(p, i)
        self.scores = [s for _, s in self.pieces]
        self.unk_id, self.byte_fallback = unk_id, byte_fallback
        if unk_id is not None and not (0 <= unk_id < len(self.pieces)):
            raise UserError(f"Unigram unk_id {unk_id} is outside the vocabulary of {len(self.pieces)} pieces")
        if unk_id is None and not byte_fallback:
            pass  # unknown characters raise at encode time
        self.min_score = min(self.scores) if self.scores else 0.0
        self.unk_score = self.min_score - UNK_PENALTY
        self.max_len = max((len(p) for p, _ in self.pieces), default=1)
        # prefix table (a trie flattened into one dict): every prefix of every piece -> (id, score) of the
        # piece spelt by that prefix, or (-1, 0.0) if it is only a prefix. Viterbi extends a match only
        # while the substring is still a prefix, so it does ~(match depth + 1) lookups per position
        # instead of max_len.
        table: dict[str, tuple[int, float]] = {}
        for p in self.vocab:
            for k in range(1, len(p)):
                table.setdefault(p[:k], (-1, 0.0))
        for p, i in self.vocab.items():
            table[p] = (i, self.scores[i])
        self._table = table

    def _lattice(self, word: str):
        """For each end position e: list of (begin, piece_id or -1 for unk, score), begins ascending."""
        n, vocab, scores, L = len(word), self.vocab, self.scores, self.max_len
        ends: list[list[tuple[int, int, float]]] = [[] for _ in range(n + 1)]
        for b in range(n):
            has_single = False
            for e in range(b + 1, min(n, b + L) + 1):
                i = vocab.get(word[b:e])
                if i is not None:
                    ends[e].append((b, i, scores[i]))
                    if e == b + 1:
                        has_single = True
            if not has_single:
                ends[b + 1].append((b, -1, self.unk_score))
        for lst in ends:
            lst.sort(key=lambda t: t[0])
        return ends

    def _best_path(self, word: str) -> tuple[list[int], list[int]]:
        """Viterbi by forward pushes over the prefix table: (back_begin, back_id) per end position, id -1
        for an unknown character. Begins are visited in ascending order and a tie never replaces, so among
        equal scores the smallest begin (longest last piece) wins, as in :meth:`viterbi_slow`."""
        n, table, unk = len(word), self._table, self.unk_score
        best = [0.0] + [-math.inf] * n
        back_b = [0] * (n + 1)
        back_i = [-1] * (n + 1)
        for b in range(n):
            base = best[b]
            e = b + 1
            t = table.get(word[b])
            if t is None or t[0] < 0:  # no single-character piece: the unknown edge (b, b+1)
                v = base + unk
                if v > best[e]:
                    best[e], back_b[e], back_i[e] = v, b, -1
            while t is not None:
                i = t[0]
                if i >= 0:
                    v = base + t[1]
                    if v > best[e]:
                        best[e], back_b[e], back_i[e] = v, b, i
                e += 1
                if e > n:
                    break
                t = table.get(word[b:e])
        return back_b, back_i

    def viterbi(self, word: str) -> list[tuple[str, int]]:
        """Best segmentation as (piece string, id or -1 for unknown)."""
        if not word:
            return []
        return self._segments(word, *self._best_path(word))

    @staticmethod
    def _segments(word: str, back_b: list[int], back_i: list[int]) -> list[tuple[str, int]]:
        """Follow the back-pointers from the end: (piece string, id or -1) left to right."""
        out = []
        e = len(word)
        while e > 0:
            b = back_b[e]
            out.append((word[b:e], back_i[e]))
            e = b
        out.reverse()
        return out

    def viterbi_slow(self, word: str) -> list[tuple[str, int]]:
        """The oracle of :meth:`viterbi`: build the whole lattice (ends -> edges), then relax end by end."""
        n = len(word)
        if n == 0:
            return []
        ends = self._lattice(word)
        best = [0.0] + [-math.inf] * n
        back: list[tuple[int, int]] = [(0, 0)] * (n + 1)
        for e in range(1, n + 1):
            bs, bb = -math.inf, None
            for b, i, s in ends[e]:
                v = best[b] + s
                if v > bs:
                    bs, bb = v, (b, i)
            best[e], back[e] = bs, bb  # type: ignore[assignment]
        out = []
        e = n
        while e > 0:
            b, i = back[e]
            out.append((word[b:e], i))
            e = b
        out.reverse()
        return out

    def _to_ids(self, segs: list[tuple[str, int]]) -> list[int]:
        ids: list[int] = []
        pending = []  # fused run of unknown characters
        for s, i in segs + [("", 0)]:
            if i == -1:
                pending.append(s)
                continue
            if pending:
                u = "".join(pending)
                pending = []
                if self.byte_fallback and all(BYTE_TOKENS[x] in self.vocab for x in u.encode("utf-8", "surrogatepass")):
                    ids.extend(self.vocab[BYTE_TOKENS[x]] for x in u.encode("utf-8", "surrogatepass"))
                elif self.unk_id is not None:
                    ids.append(self.unk_id)
                else:
                    raise UserError(f"character {u[0]!r} is not in the Unigram vocabulary and there is no unk piece")
            if s:
                ids.append(i)
        return ids

    def tokenize(self, word: str) -> list[int]:
        if not word:
            return []
        back_b, back_i = self._best_path(word)
        ids = []
        e = len(word)
        while e > 0:
            i = back_i[e]
            if i < 0:  # unknown characters on the path: fuse / byte-fallback them
                return self._to_ids(self._segments(word, back_b, back_i))
            ids.append(i)
            e = back_b[e]
        ids.reverse()
        return ids

    def sample(self, word: str, alpha: float = 0.1, rng=None) -> list[int]:
        """Subword regularisation: draw a segmentation with P(s) ∝ prod p(s_i)^alpha (forward-filtering
        backward-sampling over the lattice); alpha -> inf approaches Viterbi, alpha -> 0 uniform."""
        rng = rng or random.Random()
        n = len(word)
        if n == 0:
            return []
        ends = self._lattice(word)
        fwd = [0.0] + [-math.inf] * n
        for e in range(1, n + 1):
            xs = [fwd[b] + alpha * s for b, _, s in ends[e]]
            m = max(xs)
            fwd[e] = m + math.log(sum(math.exp(x - m) for x in xs))
        segs = []
        e = n
        while e > 0:
            xs = [fwd[b] + alpha * s - fwd[e] for b, _, s in ends[e]]
            r, acc, pick = rng.random(), 0.0, len(xs) - 1
            for k, x in enumerate(xs):
                acc += math.exp(x)
                if r < acc:
                    pick = k
                    break
            b, i, _ = ends[e][pick]
            segs.append((word[b:e], i))
            e = b
        segs.reverse()
        return self._to_ids(segs)

    def to_json(self) -> dict:
        return {
            "type": "Unigram",
            "unk_id": self.unk_id,
            "vocab": [[p, s] for p, s in self.pieces],
            "byte_fallback": self.byte_fallback,
        }

    @classmethod
    def from_json(cls, d: dict) -> "UnigramModel":
        return cls([(p, s) for p, s in d["vocab"]], d.get("unk_id"), bool(d.get("byte_fallback", False)))


def sample_encode(tok, text: str, alpha: float = 0.1, seed: int | None = None) -> list[int]:
    """Subword-regularised encoding of ``text`` with a Unigram ``SubwordTokenizer`` (a fresh sample per call)."""
    if not isinstance(tok.model, UnigramModel):
        raise UserError("sampling (subword regularisation) needs a Unigram tokenizer")
    rng = random.Random(seed)
    ids: list[int] = []
    for seg, sid in tok.segments(text):
        if sid is not None:
            ids.append(sid)
            continue
        for w in tok.words(seg):
            ids += tok.model.sample(w, alpha, rng)
    return ids
