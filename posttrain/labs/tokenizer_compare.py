"""tokenizer-compare: BPE, byte-level BPE, WordPiece and Unigram trained on the same text.

Formula: BPE merges argmax count(a, b); WordPiece argmax count(ab) / (count(a) count(b)); Unigram prunes
the pieces whose removal lowers the corpus likelihood least and segments by Viterbi,
argmax_seg prod p(piece) (or samples seg ~ prod p(piece)^alpha: subword regularisation). Byte-level BPE
starts from the 256 bytes, so every string is encodable.

Experiment: the four posttrain trainers (``TRAINERS``) on the module docstrings of posttrain itself
(every other module; the rest is held out); tokens per word on the held-out text; then a text with
characters the training text never had (accents, CJK, emoji, Greek). Checked: byte-level BPE (and BPE with
``byte_fallback``) round-trip it exactly with no unknown token; WordPiece turns a word holding one unseen
character into a single [UNK] (the whole word is lost) while BPE keeps the word's known characters, so
BPE's decode keeps more characters; Unigram's Viterbi encoding is deterministic while ``sample_encode``
draws several segmentations of one word, each decoding to the same text. ``falsify`` puts plain BPE
(no byte fallback) in the byte-level slot.
"""

from __future__ import annotations

import ast
from pathlib import Path

import posttrain
from posttrain.labs._common import memo, pyplot
from posttrain.tokenizers import TRAINERS, BPETrainer, sample_encode

NAME = "tokenizer-compare"
CLAIM = (
    "Byte-level BPE never has an out-of-vocabulary token; WordPiece outputs [UNK] for a word it cannot "
    "spell from its vocabulary (BPE falls back to characters, WordPiece does not, so it is more brittle); "
    "Unigram's encoding is deterministic by default and samples segmentations under subword regularisation."
)
FORMULA = "BPE: argmax count(a,b); WordPiece: argmax count(ab)/(count(a) count(b)); Unigram: argmax_seg prod p(piece)"
NOTES = "notes 2 (Tokenizers), comparison table (OOV handling) and Q&A (why byte-level; is encoding deterministic)"

OOV_TEXT = "naïve café — 日本語 🙂 Ωmega façade"
OOV_WORD = "Ωmega"


def _docstrings() -> list[str]:
    root = Path(posttrain.__file__).parent
    docs = []
    for p in sorted(root.rglob("*.py")):
        d = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8")))
        if d:
            docs.append(d)
    return docs


def run(ctx) -> None:
    docs = _docstrings()
    train, test = docs[0::2], docs[1::2]
    if ctx.quick:
        train, test = train[:12], test[:12]
    vocab = 400 if ctx.quick else 1500
    train_chars = set("".join(train))
    assert not set(OOV_WORD[0]) & train_chars, "the OOV text must hold unseen characters"
    toks = dict(
        memo(
            ctx,
            "tokenizers",
            lambda: {
                **{name: cls(vocab_size=vocab).train(train) for name, cls in TRAINERS.items()},
                "bpe+byte_fallback": BPETrainer(vocab_size=vocab + 256, byte_fallback=True).train(train),
            },
        )
    )
    if ctx.falsify:
        toks["byte-bpe"] = toks["bpe"]
    words = " ".join(test).split()
    per_word = {n: sum(len(t.encode(d)) for d in test) / len(words) for n, t in toks.items()}
    ctx.numbers.update(
        {
            "vocab_size": vocab,
            "train_chars": sum(map(len, train)),
            "heldout_words": len(words),
            "tokens_per_word": per_word,
        }
    )
    ctx.say("  tokens per held-out word: " + ", ".join(f"{n} {v:.2f}" for n, v in per_word.items()))
    rows = {}
    for n, t in toks.items():
        pieces = t.tokenize(OOV_TEXT)
        back = t.decode(t.encode(OOV_TEXT))
        n_unk = sum(p in ("<unk>", "[UNK]") for p in pieces)
        rows[n] = {
            "tokens": pieces,
            "decoded": back,
            "unknown_tokens": n_unk,
            "chars_kept": sum(c in back for c in OOV_TEXT if not c.isspace()),
        }
        ctx.say(f"  {n:>17}: {len(pieces):2d} tokens, {n_unk} unknown, decode -> {back!r}")
    ctx.numbers["oov"] = rows
    for n in ("byte-bpe", "bpe+byte_fallback"):
        ctx.check(
            f"{n}: decode(encode(x)) == x, no unknown token",
            [rows[n]["decoded"], rows[n]["unknown_tokens"]],
            [OOV_TEXT, 0],
            rows[n]["decoded"] == OOV_TEXT and rows[n]["unknown_tokens"] == 0,
            "exact",
        )
    wp = toks["wordpiece"].tokenize(OOV_WORD)
    bpe_word = toks["bpe"].tokenize(OOV_WORD)
    ctx.check(f"wordpiece: {OOV_WORD!r} -> a single [UNK]", wp, ["[UNK]"], wp == ["[UNK]"], "exact")
    ctx.check(
        "bpe keeps more known characters than wordpiece",
        [rows["bpe"]["chars_kept"], rows["wordpiece"]["chars_kept"]],
        "bpe > wordpiece",
        rows["bpe"]["chars_kept"] > rows["wordpiece"]["chars_kept"] and len(bpe_word) > 1,
        f"exact (characters of the OOV text present in the decode; bpe: {OOV_WORD!r} -> {' '.join(bpe_word)})",
    )

    uni = toks["unigram"]
    word = max((w for w in words if w.isalpha() and len(w) >= 9), key=lambda w: (words.count(w), w))
    det = {tuple(uni.encode(word)) for _ in range(5)}
    samples = [tuple(sample_encode(uni, word, alpha=0.1, seed=ctx.seed * 1000 + i)) for i in range(100)]
    decoded = {uni.decode(list(s)) for s in samples}
    distinct = sorted(set(samples), key=samples.count, reverse=True)
    ctx.check(f"unigram: Viterbi encoding of {word!r} is deterministic", len(det), 1, len(det) == 1, "exact (5 calls)")
    ctx.check(
        "unigram: sampled segmentations differ, all decode to the word",
        [len(distinct), sorted(decoded)],
        [">= 2", [word]],
        len(distinct) >= 2 and decoded == {word},
        "exact (100 samples, alpha = 0.1)",
    )
    seg = {" ".join(uni.id_to_token(i) for i in s): samples.count(s) for s in distinct[:8]}
    ctx.numbers["unigram_samples"] = {"word": word, "viterbi": " ".join(uni.tokenize(word)), "counts": seg}
    ctx.say(f"  unigram samples of {word!r}: " + "; ".join(f"{k} x{v}" for k, v in list(seg.items())[:5]))

    plt = pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4.5), gridspec_kw={"width_ratios": [1, 1, 1.3]})
    names = list(toks)
    ax1.bar(range(len(names)), [per_word[n] for n in names], color="C0")
    ax1.set_xticks(range(len(names)), names, rotation=20)
    ax1.set(title=f"held-out tokens per word (vocab {vocab})", ylabel="tokens / word")
    x = list(range(len(names)))
    ax2.bar(
        [i - 0.2 for i in x], [rows[n]["unknown_tokens"] for n in names], width=0.4, color="C3", label="unknown tokens"
    )
    ax2.bar(
        [i + 0.2 for i in x],
        [rows[n]["chars_kept"] for n in names],
        width=0.4,
        color="C2",
        label=f"characters kept (of {sum(not c.isspace() for c in OOV_TEXT)})",
    )
    ax2.set_xticks(range(len(names)), names, rotation=20)
    ax2.set(title="text with unseen characters (accents, CJK, emoji, Greek)", ylabel="count")
    ax2.legend(fontsize=8)
    ax3.barh(range(len(seg)), list(seg.values())[::-1], color="C1")
    ax3.set_yticks(range(len(seg)), list(seg)[::-1], fontsize=8)
    ax3.set(title=f"Unigram: 100 sampled segmentations of '{word}'", xlabel="times drawn (alpha = 0.1)")
    ctx.figure(fig, "tokenizer_compare")
