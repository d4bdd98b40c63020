"""bpe-by-hand: BPE merges the most frequent adjacent pair, step by step; the </w> suffix keeps word ends apart.

Formula: best = argmax_(a,b) count(a, b) over the corpus (ties: the smallest (a, b) strings, posttrain's
deterministic rule); replace every (a, b) by ab; repeat. With the suffix, ``low`` starts as
[l, o, w</w>], so a word-final ``w`` is a different symbol from the ``w`` inside ``lower``.

Experiment 1: ["low", "lower", "lowest"] (count 1 each) through posttrain's ``train_merges`` with and
without ``</w>``, every step printed with its pair counts, checked against a 15-line textbook BPE written
here (the independent oracle) and against the hand-worked merges of ``tokenizers/bpe.py`` (lo, low, lowe).
Experiment 2 (why </w> matters): Sennrich et al.'s corpus {low: 5, lower: 2, newest: 6, widest: 3} through
``BPETrainer`` (6 merges) with and without the suffix; on test words, count the token ids that occur both at a word's
end and inside a word. With </w> that number must be 0 (a word-final token carries the suffix and never
fits inside a word), without it the same token serves both (``est`` of "newest" inside "ester"), so word
boundaries cannot be read from the tokens (<unk> is not counted: with </w> an unseen word-internal ``t``
has no symbol, since the corpus only has ``t</w>``, another visible cost of the suffix). ``falsify`` trains the "with" tokenizer without the suffix.
"""

from __future__ import annotations

from collections import Counter

from posttrain.labs._common import pyplot
from posttrain.tokenizers.bpe import BPETrainer, initial_alphabet, train_merges

NAME = "bpe-by-hand"
CLAIM = (
    "BPE repeatedly merges the most frequent adjacent pair (on low/lower/lowest: l+o, lo+w, low+e); the </w> "
    "suffix distinguishes a word-final symbol (est</w>) from the same letters inside a word, so merges never "
    "confuse word ends with word middles."
)
FORMULA = "best = argmax_(a,b) count(a,b); replace (a,b) -> ab everywhere; repeat.  'low' -> [l, o, w</w>]"
NOTES = "notes 2 (Tokenizers), BPE worked example and Q&A 'why does BPE need </w>?'"

TEST_WORDS = ["low", "lowest", "newer", "wider", "ester", "lowlow", "newest", "slow", "wide", "rest"]


def textbook_bpe(words: dict[str, int], n: int, suffix: str | None):
    """The oracle: a plain re-count of every pair before each merge; returns (merges, steps)."""
    segs = {w: list(w[:-1]) + [w[-1] + (suffix or "")] for w in words}
    merges, steps = [], []
    for _ in range(n):
        pc = Counter()
        for w, s in segs.items():
            for p in zip(s, s[1:]):
                pc[p] += words[w]
        if not pc:
            break
        best = min(pc, key=lambda p: (-pc[p], p))
        merges.append(best)
        steps.append((dict(pc), best, {w: list(s) for w, s in segs.items()}))
        for w, s in segs.items():
            out, i = [], 0
            while i < len(s):
                if i + 1 < len(s) and (s[i], s[i + 1]) == best:
                    out.append(s[i] + s[i + 1])
                    i += 2
                else:
                    out.append(s[i])
                    i += 1
            segs[w] = out
    return merges, steps, segs


def _boundary_confusion(tok, words) -> tuple[int, dict]:
    """Learned tokens (not <unk>) seen both word-finally and word-internally on ``words``, and each word's tokens."""
    final, inner, shown = set(), set(), {}
    for w in words:
        toks = tok.tokenize(w)
        shown[w] = toks
        final.add(toks[-1])
        inner.update(toks[:-1])
    return len((final & inner) - {"<unk>"}), shown


def run(ctx) -> None:
    small = {"low": 1, "lower": 1, "lowest": 1}
    for suffix in ("</w>", None):
        _, merges = train_merges(small, 4, suffix=suffix)
        oracle, steps, _ = textbook_bpe(small, len(merges), suffix)
        tag = "with </w>" if suffix else "without </w>"
        ctx.say(f"  low/lower/lowest {tag}:")
        for i, (pc, best, segs) in enumerate(steps):
            top = ", ".join(f"{a}+{b}:{c}" for (a, b), c in sorted(pc.items(), key=lambda kv: (-kv[1], kv[0]))[:4])
            ctx.say(
                f"    step {i + 1}: {' | '.join(' '.join(s) for s in segs.values())}   counts {top} -> merge {best}"
            )
        ctx.check(
            f"merges {tag} = textbook BPE",
            [list(m) for m in merges],
            [list(m) for m in oracle],
            [tuple(m) for m in merges] == oracle,
            "exact",
        )
        ctx.numbers[f"merges {tag}"] = ["+".join(m) for m in merges]
    _, m3 = train_merges(small, 3, suffix="</w>")
    ctx.check(
        "first merges = the hand-worked example",
        ["+".join(m) for m in m3],
        ["l+o", "lo+w", "low+e"],
        [tuple(m) for m in m3] == [("l", "o"), ("lo", "w"), ("low", "e")],
        "exact (tokenizers/bpe.py docstring)",
    )

    corpus = {"low": 5, "lower": 2, "newest": 6, "widest": 3}
    shown, confusion = {}, {}
    for suffix in ("</w>", None):
        use = None if (ctx.falsify or suffix is None) else suffix
        size = 1 + len(initial_alphabet(corpus, use)) + 6  # <unk>, the symbols, 6 merges
        tok = BPETrainer(vocab_size=size, end_of_word_suffix=use, special_tokens=("<unk>",)).train_from_counts(corpus)
        confusion[suffix], shown[suffix] = _boundary_confusion(tok, TEST_WORDS)
        ctx.say(
            f"  Sennrich corpus {'with' if suffix else 'without'} </w>: "
            + "; ".join(f"{w}={' '.join(t)}" for w, t in list(shown[suffix].items())[:6])
        )
    ctx.check(
        "with </w>: tokens shared by word ends and word middles",
        confusion["</w>"],
        0,
        confusion["</w>"] == 0,
        f"exact, over {len(TEST_WORDS)} test words",
    )
    ctx.check(
        "without </w>: tokens shared by word ends and word middles",
        confusion[None],
        "> 0",
        confusion[None] > 0,
        f"exact, over {len(TEST_WORDS)} test words",
    )
    ctx.numbers["tokenized"] = {
        ("with </w>" if k else "without </w>"): {w: " ".join(t) for w, t in v.items()} for k, v in shown.items()
    }

    plt = pyplot()
    _, steps, _ = textbook_bpe(small, 3, "</w>")
    fig, axes = plt.subplots(1, 4, figsize=(15, 4), gridspec_kw={"width_ratios": [1, 1, 1, 1.6]})
    for i, (pc, best, _) in enumerate(steps):
        items = sorted(pc.items(), key=lambda kv: (-kv[1], kv[0]))[:7]
        ax = axes[i]
        ax.barh(
            [f"{a}+{b}" for (a, b), _ in items][::-1],
            [c for _, c in items][::-1],
            color=["C3" if p == best else "C0" for p, _ in items][::-1],
        )
        ax.set(title=f"step {i + 1}: merge {best[0]}+{best[1]}", xlabel="pair count")
    axes[0].set_ylabel("adjacent pair (low, lower, lowest + </w>)")
    ax = axes[3]
    ax.axis("off")
    lines = ["Sennrich corpus {low:5, lower:2, newest:6, widest:3}", ""]
    for suffix in ("</w>", None):
        lines.append(f"{'with' if suffix else 'without'} </w> ({confusion[suffix]} tokens end AND inside words):")
        lines += [f"   {w:>7}: {' '.join(shown[suffix][w])}" for w in ("newest", "ester", "lowest", "slow")]
        lines.append("")
    ax.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=9)
    ax.set_title("why </w> matters")
    ctx.figure(fig, "bpe_by_hand")
