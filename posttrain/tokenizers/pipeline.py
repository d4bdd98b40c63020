"""SubwordTokenizer: special-token split -> normaliser -> pre-tokeniser -> model -> ids, and back.

Key insight: every subword tokenizer is the same four-stage pipeline (Hugging Face's design) with a
different model in the middle, so one class implements the :class:`~posttrain.tokenizers.base.Tokenizer`
protocol for BPE, byte-level BPE, WordPiece and Unigram, and one method (``to_hf_dict``: each stage
writes its own ``to_json``) serialises all of them; :mod:`hf_json` reads them back. Encoding a text:

1. split out special/added tokens (leftmost-longest match on the raw text; never split further),
2. normalise each remaining segment, pre-tokenise it into words,
3. encode each word with the model, through a word -> ids cache (natural text is Zipfian: most words
   repeat, so most lookups hit the cache).

``encode`` never adds bos/eos (the caller decides); ``decode`` drops special tokens unless asked.
``encode_batch`` fans big batches out over processes (fork), contiguous chunks balanced by characters;
small batches stay in process, where the word cache is already warm.

Not handled: offsets, truncation/padding and post-processors (templates adding [CLS]/[SEP]): a loaded
file's post-processor is ignored because ``encode`` adds no special tokens by contract.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path

import regex

from posttrain.data.io import atomic_write_json
from posttrain.errors import UserError
from posttrain.tokenizers.symbols import bl_to_bytes

# Conventional names -> protocol role, checked in order (first present wins).
ROLE_NAMES = {
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
    "bos": ("<bos>", "<s>", "<|begin_of_text|>", "<|startoftext|>", "[CLS]"),
    "eos": ("<eos>", "</s>", "<|end_of_text|>", "<|endoftext|>", "[SEP]"),
    "unk": ("<unk>", "[UNK]", "<|unk|>"),
}

_CACHE_MAX = 1 << 20
FORK_MIN_CHARS = 1 << 19  # ~0.5 M characters per worker (~0.2 s of cold encoding) before forking pays
CHUNKS_PER_WORKER = 8  # a worker keeps its word cache across its chunks, so small chunks cost little


class SubwordTokenizer:
    """A model (BPEModel, WordPieceModel, UnigramModel) wrapped with normaliser, pre-tokeniser, decoder
    and added tokens. ``kind`` names what trained it ("bpe", "byte-bpe", "wordpiece", "unigram")."""

    def __init__(
        self,
        model,
        *,
        normalizer=None,
        pre_tokenizer=None,
        decoder=None,
        added_tokens: list[dict] | None = None,
        kind: str | None = None,
        roles: dict | None = None,
    ):
        self.model, self.normalizer, self.pre_tokenizer, self.decoder = model, normalizer, pre_tokenizer, decoder
        self.kind = kind or model.type.lower()
        self.added_tokens = sorted(added_tokens or [], key=lambda t: t["id"])
        self._itos: dict[int, str] = {i: t for t, i in model.vocab.items()}
        for t in self.added_tokens:
            self._itos[t["id"]] = t["content"]
        self._stoi = dict(model.vocab)
        for t in self.added_tokens:
            self._stoi[t["content"]] = t["id"]
        self._special_ids = {t["id"] for t in self.added_tokens if t.get("special", True)}
        contents = sorted((t["content"] for t in self.added_tokens), key=len, reverse=True)
        self._added_re = regex.compile("|".join(regex.escape(c) for c in contents)) if contents else None
        self._added_ids = {t["content"]: t["id"] for t in self.added_tokens}
        self._vocab_size = max(self._itos) + 1 if self._itos else 0
        self._roles = {}
        for role, names in ROLE_NAMES.items():
            self._roles[role] = next((self._stoi[n] for n in names if n in self._stoi), None)
        self._roles.update(roles or {})
        self._cache: dict[str, list[int]] = {}

    # --- protocol -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    pad_id = property(lambda self: self._roles["pad"])
    bos_id = property(lambda self: self._roles["bos"])
    eos_id = property(lambda self: self._roles["eos"])
    unk_id = property(lambda self: self._roles["unk"])

    def token_to_id(self, token: str) -> int | None:
        return self._stoi.get(token)

    def id_to_token(self, idx: int) -> str | None:
        return self._itos.get(int(idx))

    def get_vocab(self) -> dict[str, int]:
        return dict(self._stoi)

    def segments(self, text: str):
        """Yield (plain_text, None) and (None, special_id) pieces in order."""
        if self._added_re is None:
            yield text, None
            return
        pos = 0
        for m in self._added_re.finditer(text):
            if m.start() > pos:
                yield text[pos : m.start()], None
            yield None, self._added_ids[m.group()]
            pos = m.end()
        if pos < len(text):
            yield text[pos:], None

    def words(self, text: str) -> list[str]:
        """Normalised, pre-tokenised words of plain text (no special-token handling)."""
        if self.normalizer is not None:
            text = self.normalizer(text)
        return self.pre_tokenizer(text) if self.pre_tokenizer is not None else ([text] if text else [])

    def encode(self, text: str) -> list[int]:
        """Text -> ids; special tokens written in the text map to their id; no bos/eos added."""
        ids: list[int] = []
        cache, tok = self._cache, self.model.tokenize
        for seg, sid in self.segments(text):
            if sid is not None:
                ids.append(sid)
                continue
            for w in self.words(seg):
                r = cache.get(w)
                if r is None:
                    r = tok(w)
                    if len(cache) < _CACHE_MAX:
                        cache[w] = r
                ids += r
        return ids

    def tokenize(self, text: str) -> list[str]:
        return [self._itos[i] for i in self.encode(text)]

    def encode_batch(self, texts: list[str], workers: int | None = None) -> list[list[int]]:
        """Encode many texts; same result as ``[encode(t) for t in texts]``.

        ``workers`` processes (default: all cores; 1 = in process). Forking only pays when each worker
        gets enough text to amortise its start and its cold word cache, so below ``FORK_MIN_CHARS`` per
        worker the batch is encoded in process. Workers get a few big contiguous chunks (by character
        count) and read the texts from the forked parent's memory, so only the ids travel back."""
        workers = workers or os.cpu_count() or 1
        n_chars = sum(map(len, texts))
        workers = min(workers, n_chars // FORK_MIN_CHARS)
        if workers <= 1:
            return [self.encode(t) for t in texts]
        global _WORKER_TOK, _WORKER_TEXTS
        _WORKER_TOK, _WORKER_TEXTS = self, texts
        bounds, acc, step = [0], 0, n_chars / (CHUNKS_PER_WORKER * workers)  # dynamic load balance
        for k, t in enumerate(texts):
            acc += len(t)
            if acc >= step * len(bounds) and k + 1 < len(texts):
                bounds.append(k + 1)
        bounds.append(len(texts))
        try:
            with mp.get_context("fork").Pool(workers) as pool:
                parts = pool.map(_encode_range_in_worker, list(zip(bounds[:-1], bounds[1:])), chunksize=1)
        finally:
            _WORKER_TOK, _WORKER_TEXTS = None, None
        return [ids for part in parts for ids in part]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        tokens = []
        for i in ids:
            i = int(i)
            t = self._itos.get(i)
            if t is None or (skip_special_tokens and i in self._special_ids):
                continue
            tokens.append(t)
        if self.decoder is None:
            return " ".join(tokens)
        return "".join(self.decoder(tokens))

    # --- bytes (byte-level only) --------------------------------------------------------------
    def encode_bytes(self, data: bytes) -> list[int]:
        """Byte-level BPE over arbitrary bytes (invalid UTF-8 included): decode_bytes(encode_bytes(b)) == b."""
        return self.encode(data.decode("utf-8", "surrogateescape"))

    def decode_bytes(self, ids, skip_special_tokens: bool = True) -> bytes:
        tokens = [
            self._itos[int(i)]
            for i in ids
            if int(i) in self._itos and not (skip_special_tokens and int(i) in self._special_ids)
        ]
        return bl_to_bytes("".join(tokens))

    # --- files --------------------------------------------------------------------------------
    def to_hf_dict(self) -> dict:
        """The tokenizer.json dict (added tokens written with normalized=false, never stripped); each
        stage writes its own ``to_json``, so this needs no knowledge of the model types."""
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": [
                {
                    "id": t["id"],
                    "content": t["content"],
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": bool(t.get("special", True)),
                }
                for t in self.added_tokens
            ],
            "normalizer": self.normalizer.to_json() if self.normalizer is not None else None,
            "pre_tokenizer": self.pre_tokenizer.to_json() if self.pre_tokenizer is not None else None,
            "post_processor": None,
            "decoder": self.decoder.to_json() if self.decoder is not None else None,
            "model": self.model.to_json(),
        }

    def save(self, path: str | Path) -> None:
        """Write a Hugging Face tokenizer.json (``tokenizers.Tokenizer.from_file`` loads it)."""
        p = Path(path)
        if p.is_dir():
            p = p / "tokenizer.json"
        atomic_write_json(p, self.to_hf_dict(), indent=None)

    def __repr__(self) -> str:
        return f"SubwordTokenizer(kind={self.kind!r}, vocab_size={self.vocab_size})"


def special_added_tokens(specials) -> list[dict]:
    """A trainer's special tokens as added tokens: ids 0..k-1 (as ``tokenizers`` trainers do), never split."""
    if len(set(specials)) != len(specials):
        raise UserError(f"repeated special tokens: {list(specials)}")
    return [{"id": i, "content": t, "special": True} for i, t in enumerate(specials)]


class TextToWords:
    """Picklable normaliser + pre-tokeniser (what the corpus counters run in worker processes)."""

    def __init__(self, normalizer, pre_tokenizer):
        self.normalizer, self.pre_tokenizer = normalizer, pre_tokenizer

    def __call__(self, text: str) -> list[str]:
        return self.pre_tokenizer(self.normalizer(text) if self.normalizer is not None else text)


_WORKER_TOK: SubwordTokenizer | None = None
_WORKER_TEXTS: list[str] | None = None


def _encode_range_in_worker(span: tuple[int, int]) -> list[list[int]]:
    enc = _WORKER_TOK.encode  # type: ignore[union-attr]
    return [enc(t) for t in _WORKER_TEXTS[span[0] : span[1]]]  # type: ignore[index]
