"""The embedded default corpus: the task's demonstrations and general text, with known defects injected.

Everything is a pure function of (:class:`CorpusConfig`, the task config): the same bytes on every machine.

- ``demo`` documents: each SFT demonstration of the embedded task (:mod:`posttrain.tasks.embedded`) as
  ``{"text": "Q: 37+48= A: 85", "prompt": "37+48=", "answer": "85"}`` (the text is what the tokenizer and
  dedup read; prompt/answer are what SFT trains on).
- ``text`` documents: paragraphs of English-like prose from a small grammar over a few hundred stems with
  regular morphology (``-s -ed -ing -er -ly un- re-``), so byte-level BPE has real subwords to learn.
- injected ``exact`` duplicates (byte-identical copies), ``near`` duplicates (a paragraph with
  ``near_edits`` words replaced: estimated Jaccard of 5-character shingles ~0.85-0.95) and ``leak`` copies
  of held-out evaluation items written as demonstrations (benchmark contamination).

Each injected document comes after its original in the file, so dedup keeps the original (the first of a
cluster) and removes the copy; no document is the original of two injected ones. Every record carries
``id`` and ``kind`` (injected copies also ``source``, the id of their original); the manifest (``injected``) is what the report compares with what dedup removed.

The evaluation file for the contamination check writes each held-out item the way a demonstration is
written (``Q: 12+34= A: 46``: five words after normalisation, the contamination check's minimum; a sort problem,
``3141=`` -> ``1134``, would be four, so its documents carry the task's instruction: ``Q: sort the digits 3141= A:
1134``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from posttrain.config import check_fields, knob

STEMS = (
    "walk talk play work jump paint learn teach build count measure order answer number market garden river "
    "mountain forest village city harbor engine signal report record window letter paper station bridge "
    "farm field summer winter morning evening question pattern system method result problem student "
    "teacher worker player painter builder farmer reader writer speaker listener traveler "
    "cook clean fill open close start finish help mark call visit watch wonder travel climb plant "
    "collect connect correct direct express form follow gather hand kind light part point rest rain "
    "sail seed shape sound train trust turn view wash weather wind wish world year fair calm quick slow "
    "bright dark warm cold soft hard clear loud quiet green yellow silver golden careful useful hopeful "
    "ship boat road track stone sand cloud storm bird fish horse apple bread honey water paper lamp"
).split()
DETERMINERS = ("the", "a", "every", "each", "this", "that", "some", "another", "our", "their")
CONNECTIVES = ("and", "but", "while", "because", "although", "so", "until", "after", "before", "when")
PREPOSITIONS = ("near", "under", "over", "behind", "across", "beside", "through", "along", "around", "toward")
ADVERBS = ("slowly", "quickly", "carefully", "quietly", "often", "rarely", "again", "together", "later", "soon")


@dataclass
class CorpusConfig:
    paragraphs: int = knob(1500, "general-text paragraphs (before injected duplicates)", ge=1)
    sentences: int = knob(5, "sentences per paragraph (each 6-14 words)", ge=1)
    exact_dups: int = knob(120, "injected byte-identical copies of documents (paragraphs and demonstrations)", ge=0)
    near_dups: int = knob(120, "injected near duplicates of paragraphs (a few words replaced)", ge=0)
    near_edits: int = knob(2, "words replaced in each near duplicate", ge=1)
    leaks: int = knob(48, "held-out evaluation items copied into the corpus as demonstrations", ge=0)
    seed: int = knob(0, "seed of the generated text and of what is injected where", ge=0)

    def __post_init__(self):
        check_fields(self, "corpus.")


def _inflect(rng: random.Random, stem: str) -> str:
    suffix = rng.choice(("", "", "s", "ed", "ing", "er", "ers", "ly", "ness", "ful"))
    word = stem + suffix if not (stem.endswith("e") and suffix[:1] in ("e", "i")) else stem[:-1] + suffix
    if rng.random() < 0.08:
        word = rng.choice(("un", "re", "pre", "over")) + word
    return word


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(DETERMINERS), _inflect(rng, rng.choice(STEMS)), _inflect(rng, rng.choice(STEMS))]
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        if kind < 0.35:
            words += [rng.choice(PREPOSITIONS), rng.choice(DETERMINERS), _inflect(rng, rng.choice(STEMS))]
        elif kind < 0.6:
            words += [
                rng.choice(CONNECTIVES),
                rng.choice(DETERMINERS),
                _inflect(rng, rng.choice(STEMS)),
                _inflect(rng, rng.choice(STEMS)),
            ]
        elif kind < 0.8:
            words.append(rng.choice(ADVERBS))
        else:
            words += (
                ["in", str(rng.randint(1800, 2030))]
                if rng.random() < 0.5
                else [str(rng.randint(2, 999)), _inflect(rng, rng.choice(STEMS))]
            )
    text = " ".join(words)
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", "!", "?"))


def paragraph(rng: random.Random, sentences: int) -> str:
    return " ".join(_sentence(rng) for _ in range(sentences))


def demo_text(prompt: str, answer: str, instruction: str = "") -> str:
    """A problem written as a document: ``"Q: 12+34= A: 46"``; with the task's ``instruction`` (sort's) before the
    prompt, ``"Q: sort the digits 3141= A: 1134"``, so that it has the contamination check's five words."""
    return f"Q: {instruction + ' ' if instruction else ''}{prompt} A: {answer}"


def _near(rng: random.Random, text: str, edits: int) -> str:
    words = text.split(" ")
    for i in rng.sample(range(len(words)), min(edits, len(words))):
        new = _inflect(rng, rng.choice(STEMS))
        while new == words[i]:
            new = _inflect(rng, rng.choice(STEMS))
        words[i] = new
    return " ".join(words)


def build_corpus(cfg: CorpusConfig, task) -> tuple[list[dict], dict]:
    """-> (records in file order, manifest {"injected": {kind: n}, "originals": n, "leaked_prompts": [...]})."""
    rng = random.Random(f"pipeline-corpus:{cfg.seed}")
    originals = [
        {
            "kind": "demo",
            "text": demo_text(p.prompt, p.answer, task.instruction),
            "prompt": p.prompt,
            "answer": p.answer,
        }
        for p in task.demonstrations()
    ]
    originals += [{"kind": "text", "text": paragraph(rng, cfg.sentences)} for _ in range(cfg.paragraphs)]
    rng.shuffle(originals)
    n = len(originals)
    keyed = [(float(i), r) for i, r in enumerate(originals)]
    paragraphs = [i for i, r in enumerate(originals) if r["kind"] == "text"]
    if cfg.exact_dups + cfg.near_dups > n or cfg.near_dups > len(paragraphs):
        from posttrain.errors import ConfigError

        raise ConfigError(
            f"corpus: {cfg.exact_dups} exact + {cfg.near_dups} near duplicates need more originals "
            f"than the {n} documents ({len(paragraphs)} paragraphs)"
        )
    near_src = rng.sample(paragraphs, cfg.near_dups)
    rest = sorted(set(range(n)) - set(near_src))
    exact_src = rng.sample(rest, cfg.exact_dups)

    def after(i: int) -> float:  # a position after original i, before the end
        return i + rng.random() * (n - i)

    for i in exact_src:
        keyed.append((after(i), {**originals[i], "kind": "exact", "source": i}))
    for i in near_src:
        keyed.append(
            (after(i), {"kind": "near", "text": _near(rng, originals[i]["text"], cfg.near_edits), "source": i})
        )
    evals = task.eval_problems()
    leaked = rng.sample(evals, min(cfg.leaks, len(evals)))
    for p in leaked:
        keyed.append(
            (
                rng.random() * n,
                {
                    "kind": "leak",
                    "text": demo_text(p.prompt, p.answer, task.instruction),
                    "prompt": p.prompt,
                    "answer": p.answer,
                },
            )
        )
    order = sorted(range(len(keyed)), key=lambda j: keyed[j][0])
    new_id = {j: i for i, j in enumerate(order)}  # originals are keyed[0..n-1]: original j gets id new_id[j]
    records = []
    for i, j in enumerate(order):
        r = dict(keyed[j][1])
        if "source" in r:
            r["source"] = new_id[r["source"]]
        records.append({"id": i, **r})
    manifest = {
        "originals": n,
        "injected": {"exact": cfg.exact_dups, "near": cfg.near_dups, "leak": len(leaked)},
        "leaked_prompts": [p.prompt for p in leaked],
    }
    return records, manifest


def eval_records(task) -> list[dict]:
    """The held-out items as the contamination check reads them (and as ``posttrain eval`` does)."""
    return [
        {"text": demo_text(p.prompt, p.answer, task.instruction), "prompt": p.prompt, "answer": p.answer}
        for p in task.eval_problems()
    ]
