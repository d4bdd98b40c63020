"""The two stages before any model: dedup (exact + MinHash near duplicates + contamination) and the tokenizer.

Dedup runs :func:`posttrain.data.dedup.run.dedup` once (MinHash/LSH with the evaluation set as the
contamination reference, contaminated documents dropped) and then reads its ``clusters.jsonl``: a removed
document identical (after normalisation) to its cluster's representative is an *exact* duplicate, one that
differs is a *near* duplicate, one that is its own representative was dropped for *contamination*. On the
embedded corpus these counts are compared with what was injected (:mod:`posttrain.pipeline.corpus`): the
MinHash method promises to find a pair of true Jaccard J with probability ``s_curve(J; b, r)`` (candidate
generation; candidates are then verified exactly near the threshold), so the expected number of near
duplicates found is the sum of that probability over the injected pairs, and the report checks the found
count is within 3 s.d. of it. A near duplicate whose true Jaccard is below the threshold is, by the
method's definition, not a duplicate.

The tokenizer stage trains byte-level BPE (:class:`~posttrain.tokenizers.ByteLevelBPETrainer`'s merges) on
the kept texts with pre-tokenisation ``Sequence[Digits(individual_digits), ByteLevel]``, so a number is
always spelled digit by digit (the arithmetic answers stay learnable), and saves ``tokenizer.json``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
from pathlib import Path

from posttrain.data.dedup.shingles import jaccard, normalize, parse_normalize, shingle_strings
from posttrain.data.io import atomic_write_json, iter_jsonl
from posttrain.errors import DataError
from posttrain.pipeline.base import write_jsonl
from posttrain.pipeline.corpus import build_corpus, eval_records
from posttrain.tasks.embedded import embedded_task


def dedup_key_config(cfg) -> dict:
    key = {"dedup": cfg.dedup, "task": cfg.task}
    if not cfg.corpus_file:
        key["corpus"] = cfg.corpus
        key["val_problems"] = cfg.sft.val_problems  # val.jsonl
    return key


def write_validation(cfg, out: Path) -> int | None:
    """``val.jsonl`` on the embedded corpus: problems of the task's dev split (never trained on, never an evaluation
    item), which SFT restarts are ranked on (``trainers/sft_restarts.py``)."""
    if cfg.corpus_file:
        return None
    from posttrain.trainers.sft_restarts import validation_problems

    probe = dataclasses.replace(cfg.sft, task=cfg.task, data=None, val_data=None)
    return write_jsonl(out / "val.jsonl", [{"prompt": p, "answer": a} for p, a in validation_problems(probe)])


def _user_records(path: str) -> list[dict]:
    """The user's corpus records, each with the ``text`` dedup and the tokenizer read: its ``text``; a
    demonstration's prompt and answer (or TRL's ``completion``); a conversation's (``messages``) contents, one
    message a line. Conversations and demonstrations are also what SFT trains on (:func:`_demo`)."""
    from posttrain.chat import check_messages

    out = []
    for i, (line_no, rec) in enumerate(iter_jsonl(path)):
        loc = f"{path}:{line_no}"
        text = rec.get("text")
        answer = rec.get("answer", rec.get("completion"))
        if text is None and "messages" in rec:
            msgs, reason = check_messages(rec["messages"], "messages", need_assistant=True)
            if reason:
                raise DataError(f"{loc}: {reason}")
            text = "\n".join(m["content"] for m in msgs)
        elif text is None and isinstance(rec.get("prompt"), str) and isinstance(answer, str):
            text = f"{rec['prompt']} {answer}"
        if not isinstance(text, str):
            raise DataError(
                f"{loc}: a corpus record needs a 'text' string, 'prompt' and 'answer' (or 'completion'), or a "
                "'messages' conversation"
            )
        out.append({**rec, "id": i, "text": text, "kind": rec.get("kind", "user")})
    return out


def _demo(rec: dict) -> dict | None:
    """What SFT trains on from a corpus record: a conversation, or a (prompt, answer) demonstration; None for text."""
    if isinstance(rec.get("messages"), list):
        return {"messages": rec["messages"]}
    answer = rec.get("answer", rec.get("completion"))
    if isinstance(rec.get("prompt"), str) and isinstance(answer, str):
        return {"prompt": rec["prompt"], "answer": answer}
    return None


def run_dedup(ctx, out: Path) -> dict:
    from posttrain.data.dedup.lsh import s_curve
    from posttrain.data.dedup.run import dedup

    cfg = ctx.cfg
    task = embedded_task(cfg.task)  # arithmetic, or --task sort: its own demonstrations in the corpus
    out.mkdir(parents=True, exist_ok=True)
    if cfg.corpus_file:
        records, manifest = _user_records(cfg.corpus_file), None
    else:
        records, manifest = build_corpus(cfg.corpus, task)
    write_jsonl(out / "raw.jsonl", records)
    if cfg.eval_file:
        evals = [
            {"text": f"{r['prompt']} {r['answer']}", **r}
            for _, r in iter_jsonl(cfg.eval_file, required=("prompt", "answer"))
        ]
    else:
        evals = eval_records(task)
    write_jsonl(out / "eval.jsonl", evals)
    dcfg = cfg.dedup
    dcfg = dataclasses.replace(dcfg, id_field="id", contamination=(str(out / "eval.jsonl"),), progress=not ctx.quiet)
    stats = dedup(
        [str(out / "raw.jsonl")],
        out / "kept.jsonl",
        dcfg,
        clusters=out / "clusters.jsonl",
        stats_path=out / "dedup_stats.json",
    )
    by_id = {r["id"]: r for r in records}
    steps = parse_normalize(dcfg.normalize)
    kept_ids = {json.loads(line)["id"] for line in (out / "kept.jsonl").open(encoding="utf-8")}
    removed = collections.Counter()
    pairs = []  # (jaccard, removed doc kind) of every merged pair, for the S-curve plot
    for line in (out / "clusters.jsonl").open(encoding="utf-8"):
        c = json.loads(line)
        i, rep = c["id"], c["representative"]
        if i in kept_ids:
            continue
        if rep == i:
            removed["contamination"] += 1
            continue
        a, b = normalize(by_id[i]["text"], steps), normalize(by_id[rep]["text"], steps)
        kind = "exact" if a == b else "near"
        removed[kind] += 1
        if kind == "near":
            pairs.append(
                jaccard(shingle_strings(a, dcfg.ngram, dcfg.shingle), shingle_strings(b, dcfg.ngram, dcfg.shingle))
            )
    summary = {
        "documents_in": stats["documents_in"],
        "kept": stats["kept"],
        "removed": {k: removed[k] for k in ("exact", "near", "contamination")},
        "lsh": {k: stats["lsh"][k] for k in ("bands", "rows", "threshold")} if "lsh" in stats else {},
        "candidate_pairs": stats.get("candidate_pairs"),
        "merged_pair_jaccard": [round(j, 4) for j in pairs],
        "contaminated_eval_items": stats.get("contamination", {}).get("contaminated_eval_items"),
        "eval_items": len(evals),
        "dedup_seconds": stats["time_s"]["total"],
    }
    if manifest is not None:
        near_j = []
        for r in records:
            if r["kind"] == "near":
                a, b = normalize(r["text"], steps), normalize(by_id[r["source"]]["text"], steps)
                near_j.append(
                    jaccard(shingle_strings(a, dcfg.ngram, dcfg.shingle), shingle_strings(b, dcfg.ngram, dcfg.shingle))
                )
        lsh = summary["lsh"]
        thr = lsh.get("threshold", dcfg.threshold)
        p = [float(s_curve(j, lsh["bands"], lsh["rows"])) if j >= thr else 0.0 for j in near_j] if lsh else []
        expected, sd = sum(p), math.sqrt(sum(x * (1 - x) for x in p))
        inj = manifest["injected"]
        summary["injected"] = dict(inj)
        summary["injected_near_jaccard"] = [round(j, 4) for j in near_j]
        summary["injected_near_above_threshold"] = sum(j >= thr for j in near_j)
        summary["expected_near_found"] = round(expected, 2)
        summary["expected_near_sd"] = round(sd, 3)
        summary["counts_match"] = {
            "exact": removed["exact"] == inj["exact"],
            "near": abs(removed["near"] - expected) <= 3 * sd + 0.5,
            "contamination": removed["contamination"] == inj["leak"],
        }
        summary["leaked_prompts"] = manifest["leaked_prompts"]
    # SFT data: the demonstrations dedup kept, and (for the contamination run) every demonstration in the raw corpus
    kept_demos = [d for d in (_demo(by_id[i]) for i in sorted(kept_ids)) if d is not None]
    raw_demos = [d for d in (_demo(r) for r in records) if d is not None]
    if not kept_demos:
        raise DataError(
            f"{cfg.corpus_file or 'the corpus'}: no {{prompt, answer}} or 'messages' records survive dedup: SFT "
            f"has nothing to train on"
        )
    summary["conversations_kept"] = sum("messages" in d for d in kept_demos)
    summary["demos_kept"] = write_jsonl(out / "sft.jsonl", kept_demos)
    summary["demos_raw"] = write_jsonl(out / "sft_raw.jsonl", raw_demos)
    summary["validation_problems"] = write_validation(cfg, out)
    atomic_write_json(out / "summary.json", summary)
    return summary


# ---------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(texts: list[str], vocab_size: int, min_frequency: int, individual_digits: bool):
    """Byte-level BPE with ``Sequence[Digits, ByteLevel]`` pre-tokenisation -> SubwordTokenizer."""
    from posttrain.tokenizers import ByteLevelBPETrainer
    from posttrain.tokenizers.pre_tokenizers import ByteLevel, Digits, PreTokenizerSequence

    trainer = ByteLevelBPETrainer(vocab_size=vocab_size, min_frequency=min_frequency, workers=1)
    digits, bl = Digits(individual_digits), ByteLevel(add_prefix_space=False)
    counts: collections.Counter = collections.Counter()
    for t in texts:
        for piece in digits(t):
            counts.update(bl.split(piece))
    tok = trainer.train_from_counts(dict(counts))
    tok.pre_tokenizer = PreTokenizerSequence([digits, ByteLevel(add_prefix_space=False)])
    tok._cache.clear()
    return tok


def tokenizer_stats(tok, texts: list[str]) -> dict:
    n_tokens = n_words = n_bytes = 0
    per_word = collections.Counter()
    for t in texts:
        n_tokens += len(tok.encode(t))
        n_bytes += len(t.encode("utf-8"))
        for w in t.split():
            k = len(tok.encode(" " + w)) if n_words else len(tok.encode(w))
            per_word[k] += 1
            n_words += 1
    digits_ok = (
        all(len(tok.encode(d)) == 1 for d in "0123456789")
        and tok.decode(tok.encode("37+48=85")) == "37+48=85"
        and len(tok.encode("1234")) == 4
    )
    return {
        "vocab_size": tok.vocab_size,
        "tokens": n_tokens,
        "words": n_words,
        "bytes": n_bytes,
        "tokens_per_word": n_tokens / max(n_words, 1),
        "bytes_per_token": n_bytes / max(n_tokens, 1),
        "tokens_per_word_histogram": {str(k): v for k, v in sorted(per_word.items())},
        "digits_single_tokens": digits_ok,
        "example": {"text": "Q: 37+48= A: 85", "tokens": _tokens(tok, "Q: 37+48= A: 85")},
    }


def _tokens(tok, text: str) -> list[str]:
    if hasattr(tok, "tokenize"):
        return tok.tokenize(text)
    return [tok.decode([i], skip_special_tokens=False) for i in tok.encode(text)]  # a model's own tokenizer


def run_tokenizer(ctx, out: Path) -> dict:
    cfg = ctx.cfg.tokenizer
    texts = [json.loads(line)["text"] for line in (ctx.dir("dedup") / "kept.jsonl").open(encoding="utf-8")]
    out.mkdir(parents=True, exist_ok=True)
    if ctx.cfg.hf_model:  # no tokenizer is trained: the model's own is used by every stage (it travels in checkpoints)
        from posttrain.models.loading import load_model_tokenizer

        tok = load_model_tokenizer(ctx.cfg.hf_model, pad_token=ctx.cfg.pad_token)
        s = tokenizer_stats(tok, texts)
        s["kind"] = "hf_model"
        s["note"] = (
            f"No tokenizer trained: hf_model = {ctx.cfg.hf_model}, so every stage uses that model's own "
            f"tokenizer (its files travel in each checkpoint); [tokenizer] settings are ignored. The table "
            f"gives that tokenizer's numbers on the deduplicated corpus."
        )
        atomic_write_json(out / "summary.json", s)
        return s
    if cfg.kind == "char":
        from posttrain.tokenizers.char import CharTokenizer

        tok = CharTokenizer(embedded_task(ctx.cfg.task).alphabet)
        tok.save(out / "tokenizer.json")
        texts = [
            f"{json.loads(line)['prompt']}{json.loads(line)['answer']}"
            for line in (ctx.dir("dedup") / "sft.jsonl").open(encoding="utf-8")
        ]
        s = {
            "vocab_size": tok.vocab_size,
            "tokens_per_word": None,
            "bytes_per_token": 1.0,
            "digits_single_tokens": True,
        }
    else:
        tok = train_tokenizer(texts, cfg.vocab_size, cfg.min_frequency, cfg.individual_digits)
        tok.save(out / "tokenizer.json")
        s = tokenizer_stats(tok, texts)
    s["kind"] = cfg.kind
    atomic_write_json(out / "summary.json", s)
    return s
