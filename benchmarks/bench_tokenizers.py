"""Tokenizer benchmark: posttrain vs Hugging Face `tokenizers` vs `sentencepiece`, side by side in one run.

    .venv/bin/python benchmarks/bench_tokenizers.py            # ~60 MB corpus, vocab 8k and 32k
    .venv/bin/python benchmarks/bench_tokenizers.py --quick    # ~8 MB corpus, a few minutes

Corpus (built once, offline, under /tmp/posttrain_tok_bench/ unless --workdir): Debian package
documentation and man pages already on the machine (``/usr/share/doc``, ``/usr/share/man``, gunzipped),
Chinese/Japanese/Korean text from the translated message catalogs in ``/usr/share/locale/{zh_*,ja,ko}``
(``.mo`` files, ~15% of the corpus), then the Python standard library's sources if still short.

Every measurement runs in a fresh subprocess (so peak RSS is per run: the process plus its worker
processes). Training: seconds and peak RSS per model type and vocabulary size, 2 cores for everyone
(``workers=2``, ``RAYON_NUM_THREADS=2``, ``num_threads=2``), and the compression each library's freshly
trained tokenizer reaches on the encode sample (tokens per 1000 characters: evidence that a faster
trainer did not buy its speed with a worse vocabulary). Encoding: MB/s of UTF-8 text on a ~2 MB
sample of the corpus lines (every k-th line), with *the same tokenizer.json* (ours, 8k) loaded in posttrain and in
`tokenizers` (``encode_batch_fast``; sentencepiece with its own 8k model), single-threaded and batched on 2 cores; median
of ``--repeats``. Both sides do the same thing: one batch call over the whole sample (ours ``encode_batch``), with a
tokenizer loaded afresh for every repeat, so both word caches start cold; single-threaded runs are timed by CPU clock
(``time.process_time``, robust on a shared machine), 2-way runs by wall clock. Ratios are peer time / our time for
training (>1: we are faster) and ours / peer for throughput.
"""

from __future__ import annotations

import argparse
import gettext
import gzip
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# this file is named like the `tokenizers` package: keep its directory off the import path
MODELS = ("bpe", "byte-bpe", "wordpiece", "unigram")
SPM_TYPES = {"bpe": "bpe", "unigram": "unigram"}


# ------------------------------------------------------------------------------------------------
# Corpus
# ------------------------------------------------------------------------------------------------
def _decode(raw: bytes) -> str | None:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _cjk_lines():
    base = Path("/usr/share/locale")
    for lang in sorted(base.glob("*")):
        if not (lang.name.startswith("zh") or lang.name in ("ja", "ko")):
            continue
        for mo in sorted(lang.glob("LC_MESSAGES/*.mo")):
            try:
                with open(mo, "rb") as fh:
                    cat = gettext.GNUTranslations(fh)._catalog  # msgid -> msgstr
            except Exception:
                continue
            for v in cat.values():
                for line in str(v).splitlines():
                    if line.strip():
                        yield line


def _doc_lines():
    for base in (Path("/usr/share/doc"), Path("/usr/share/man"), Path(sys.base_prefix) / "lib"):
        for p in sorted(base.rglob("*")):
            if not p.is_file() or p.is_symlink():
                continue
            if base.name == "lib" and p.suffix != ".py":
                continue
            if p.suffix.lower() in (".pdf", ".ps", ".png", ".jpg", ".gif", ".ico", ".woff", ".ttf"):
                continue
            try:
                raw = p.read_bytes()
                if p.suffix == ".gz":
                    raw = gzip.decompress(raw)
            except (OSError, EOFError, gzip.BadGzipFile):
                continue
            if b"\x00" in raw[:4096]:
                continue
            text = _decode(raw)
            if text is None:
                continue
            for line in text.splitlines():
                if line.strip():
                    yield line


def build_corpus(path: Path, target_mb: float) -> Path:
    if path.exists() and path.stat().st_size >= target_mb * 0.95e6:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    target = int(target_mb * 1e6)
    cjk_budget = int(0.15 * target)
    n = 0
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for line in _cjk_lines():
            b = len(line.encode("utf-8")) + 1
            if n + b > cjk_budget:
                break
            out.write(line + "\n")
            n += b
        for line in _doc_lines():
            out.write(line + "\n")
            n += len(line.encode("utf-8")) + 1
            if n >= target:
                break
    os.replace(tmp, path)
    return path


def sample_lines(corpus: Path, target_mb: float = 2.0) -> list[str]:
    """Every k-th line of the corpus, k chosen for about ``target_mb`` of text."""
    every = max(1, round(corpus.stat().st_size / (target_mb * 1e6)))
    with open(corpus, encoding="utf-8") as fh:
        return [line.rstrip("\n") for i, line in enumerate(fh) if i % every == 0]


# ------------------------------------------------------------------------------------------------
# One measurement (runs in its own process)
# ------------------------------------------------------------------------------------------------
def _peak_rss_mb() -> float:
    import resource

    s = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    c = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(s, c) / 1024  # Linux: KiB


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (all threads): the training work, which a
    shared machine's load does not inflate the way it inflates wall time."""
    import resource

    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def _hf_trainer(model: str, vocab: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    if model == "bpe":
        t = Tokenizer(models.BPE(unk_token="<unk>", end_of_word_suffix="</w>"))
        t.pre_tokenizer = pre_tokenizers.Whitespace()
        t.decoder = decoders.BPEDecoder()
        tr = trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=["<pad>", "<unk>", "<bos>", "<eos>"],
            end_of_word_suffix="</w>",
            show_progress=False,
        )
    elif model == "byte-bpe":
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.decoder = decoders.ByteLevel()
        tr = trainers.BpeTrainer(
            vocab_size=vocab,
            special_tokens=["<pad>", "<bos>", "<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif model == "wordpiece":
        t = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        t.normalizer = normalizers.BertNormalizer(lowercase=True)
        t.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        t.decoder = decoders.WordPiece()
        tr = trainers.WordPieceTrainer(
            vocab_size=vocab, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], show_progress=False
        )
    else:
        t = Tokenizer(models.Unigram())
        t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " ")])
        t.pre_tokenizer = pre_tokenizers.Metaspace()
        t.decoder = decoders.Metaspace()
        tr = trainers.UnigramTrainer(
            vocab_size=vocab,
            special_tokens=["<unk>", "<pad>", "<bos>", "<eos>"],
            unk_token="<unk>",
            show_progress=False,
        )
    return t, tr


def run_one(job: dict) -> dict:
    kind, lib, model, corpus = job["kind"], job["lib"], job["model"], job["corpus"]
    out: dict = {}
    if kind == "train":
        vocab, dest = job["vocab"], job["dest"]
        t0, c0 = time.perf_counter(), _cpu_s()
        if lib == "ours":
            from posttrain.tokenizers import TRAINERS
            from posttrain.tokenizers.corpus import iter_texts

            trainer = TRAINERS[model](vocab_size=vocab, workers=2)
            tok = trainer.train(
                iter_texts([corpus], keep_bytes=trainer.keep_bytes, keep_newlines=trainer.keep_newlines)
            )
            out["seconds"], out["cpu_s"] = time.perf_counter() - t0, _cpu_s() - c0
            tok.save(dest)
            out["vocab"] = tok.vocab_size
        elif lib == "hf":
            t, tr = _hf_trainer(model, vocab)
            t.train([corpus], tr)
            out["seconds"], out["cpu_s"] = time.perf_counter() - t0, _cpu_s() - c0
            t.save(dest)
            out["vocab"] = t.get_vocab_size()
        else:
            import sentencepiece as spm

            spm.SentencePieceTrainer.train(
                input=corpus,
                model_prefix=dest,
                model_type=SPM_TYPES[model],
                vocab_size=vocab,
                character_coverage=0.9995,
                num_threads=2,
                minloglevel=2,
                max_sentence_length=1 << 16,
            )
            out["seconds"], out["cpu_s"] = time.perf_counter() - t0, _cpu_s() - c0
            out["vocab"] = vocab
        # compression of the tokenizer just trained, on the encode sample (after the peak-RSS reading)
        out["rss_mb"] = _peak_rss_mb()
        lines = sample_lines(Path(corpus))
        chars = sum(map(len, lines))
        if lib == "ours":
            n_tokens = sum(map(len, tok.encode_batch(lines, workers=1)))
        elif lib == "hf":
            n_tokens = sum(len(e.ids) for e in t.encode_batch(lines, add_special_tokens=False))
        else:
            n_tokens = sum(map(len, spm.SentencePieceProcessor(model_file=dest + ".model").encode(lines)))
        out["tok_per_kchar"] = 1000 * n_tokens / chars
        return out
    else:  # encode
        lines = sample_lines(Path(corpus))
        mb = sum(len(s.encode("utf-8")) for s in lines) / 1e6

        # Same work on both sides: one batch call on the whole sample, a freshly loaded tokenizer (cold word
        # caches on both sides) per repeat; single-threaded runs are timed by CPU clock (the box is shared),
        # 2-way runs by wall clock, interleaved with a 1-way wall-clock run of the same library where it can
        # switch in process (ours, sentencepiece), so the 2-way speedup compares like with like.
        def once(threads: int, clock) -> float:
            if lib == "ours":
                from posttrain.tokenizers import load

                tok = load(job["file"])
                t0 = clock()
                tok.encode_batch(lines, workers=threads)
            elif lib == "hf":
                from tokenizers import Tokenizer

                tok = Tokenizer.from_file(job["file"])
                enc = getattr(tok, "encode_batch_fast", tok.encode_batch)  # no offsets, like ours
                t0 = clock()
                enc(lines, add_special_tokens=False)
            else:
                import sentencepiece as spm

                sp = spm.SentencePieceProcessor(model_file=job["file"])
                t0 = clock()
                sp.encode(lines, num_threads=threads)
            return clock() - t0

        times, times_1way = [], []
        for _ in range(job["repeats"]):
            if job["threads"] == 1:
                times.append(once(1, time.process_time))
            else:
                times.append(once(job["threads"], time.perf_counter))
                if lib != "hf":  # tokenizers fixes its thread count at start-up
                    times_1way.append(once(1, time.perf_counter))
        if times_1way:
            out["speedup"] = statistics.median(times_1way) / statistics.median(times)
        out["mb_per_s"] = mb / statistics.median(times)
        out["mb"] = mb
    out["rss_mb"] = _peak_rss_mb()
    return out


def spawn(job: dict, timeout: float) -> dict:
    env = dict(
        os.environ,
        PYTHONPATH=str(ROOT),
        RAYON_NUM_THREADS=str(job.get("threads", 2)),
        TOKENIZERS_PARALLELISM="true" if job.get("threads", 2) > 1 else "false",
    )
    try:
        r = subprocess.run(
            [sys.executable, __file__, "--_job", json.dumps(job)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout {timeout:.0f}s"}
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": last[:80]}
    return json.loads(r.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------
# Table
# ------------------------------------------------------------------------------------------------
def _fmt(r: dict | None, key: str, fmt: str) -> str:
    if r is None:
        return "-"
    if "error" in r:
        return "timeout" if r["error"].startswith("timeout") else "failed"
    return format(r[key], fmt)


def _ratio(peer: dict | None, ours: dict | None, key: str, fmt: str = ".2f") -> str:
    """peer[key] / ours[key], or '-' when either run is missing or failed."""
    if peer is None or ours is None or "error" in peer or "error" in ours:
        return "-"
    return format(peer[key] / ours[key], fmt)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~8 MB corpus instead of ~60 MB")
    ap.add_argument("--mb", type=float, default=None, help="corpus size in MB (default 60, quick 8)")
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--vocab-sizes", nargs="+", type=int, default=[8000, 32000])
    ap.add_argument("--repeats", type=int, default=3, help="encode repeats (median)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per training run before giving up")
    ap.add_argument("--workdir", default="/tmp/posttrain_tok_bench")
    ap.add_argument(
        "--encode-only",
        action="store_true",
        help="skip training; encode with the files an earlier run left in --workdir",
    )
    ap.add_argument(
        "--train-libs",
        nargs="+",
        default=["ours", "hf", "spm"],
        choices=["ours", "hf", "spm"],
        help="libraries to train (e.g. leave out hf for unigram: its trainer runs for many minutes)",
    )
    ap.add_argument("--_job", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._job:
        print(json.dumps(run_one(json.loads(args._job))))
        return 0

    mb = args.mb or (8 if args.quick else 60)
    work = Path(args.workdir)
    t0 = time.perf_counter()
    corpus = build_corpus(work / f"corpus_{mb:g}mb.txt", mb)
    size = corpus.stat().st_size / 1e6
    print(
        f"corpus: {corpus} ({size:.1f} MB, built/checked in {time.perf_counter() - t0:.0f}s); "
        f"cores: {os.cpu_count()}; runs use 2",
        flush=True,
    )

    rows = []
    enc_rows = []
    for model in args.models:
        for vocab in [] if args.encode_only else args.vocab_sizes:
            res = {}
            for lib in ("ours", "hf", "spm"):
                if (lib == "spm" and model not in SPM_TYPES) or lib not in args.train_libs:
                    res[lib] = None
                    continue
                dest = str(work / (f"{lib}_{model}_{vocab}" + (".json" if lib != "spm" else "")))
                res[lib] = spawn(
                    dict(kind="train", lib=lib, model=model, vocab=vocab, corpus=str(corpus), dest=dest, threads=2),
                    args.timeout,
                )
                print(f"  train {model:9s} {vocab:6d} {lib:4s} {res[lib]}", flush=True)
            rows.append((model, vocab, res))
        # encoding with the smallest vocabulary's files
        vocab = min(args.vocab_sizes)
        ours_file = str(work / f"ours_{model}_{vocab}.json")
        enc = {}
        for threads in (1, 2):
            for lib, f in (("ours", ours_file), ("hf", ours_file), ("spm", str(work / f"spm_{model}_{vocab}.model"))):
                if lib == "spm" and (model not in SPM_TYPES or not Path(f).exists()):
                    enc[(lib, threads)] = None
                    continue
                if not Path(f).exists():
                    enc[(lib, threads)] = {"error": "no model"}
                    continue
                enc[(lib, threads)] = spawn(
                    dict(
                        kind="encode",
                        lib=lib,
                        model=model,
                        file=f,
                        corpus=str(corpus),
                        threads=threads,
                        repeats=args.repeats,
                    ),
                    900,
                )
                print(f"  encode {model:9s} {lib:4s} x{threads} {enc[(lib, threads)]}", flush=True)
        enc_rows.append((model, enc))

    print()
    print(
        f"Training on {size:.1f} MB, 2 cores (wall seconds, peak RSS MB, CPU seconds of all threads and worker "
        f"processes; ratio = peer s / our s, >1 means we are faster)"
    )
    print(
        "| model     | vocab  | ours s | tokenizers s | sentencepiece s | tok/ours | spm/ours | ours RSS | tok RSS | spm RSS "
        "| ours CPU s | tok CPU s | spm CPU s | spm/ours CPU |"
    )
    print(
        "|-----------|--------|--------|--------------|-----------------|----------|----------|----------|---------|---------"
        "|------------|-----------|-----------|--------------|"
    )
    for model, vocab, r in rows:
        o, h, s = r["ours"], r["hf"], r["spm"]
        print(
            f"| {model:9s} | {vocab:6d} | {_fmt(o, 'seconds', '6.1f'):>6s} | {_fmt(h, 'seconds', '12.1f'):>12s} | "
            f"{_fmt(s, 'seconds', '15.1f'):>15s} | {_ratio(h, o, 'seconds'):>8s} | {_ratio(s, o, 'seconds'):>8s} | "
            f"{_fmt(o, 'rss_mb', '8.0f'):>8s} | "
            f"{_fmt(h, 'rss_mb', '7.0f'):>7s} | {_fmt(s, 'rss_mb', '7.0f'):>7s} | {_fmt(o, 'cpu_s', '10.1f'):>10s} | "
            f"{_fmt(h, 'cpu_s', '9.1f'):>9s} | {_fmt(s, 'cpu_s', '9.1f'):>9s} | {_ratio(s, o, 'cpu_s'):>12s} |"
        )
    print()
    print(
        "Compression: tokens per 1000 characters of the encode sample, each library encoding with the tokenizer it "
        "trained in the rows above (lower = fewer tokens; ratio = peer / ours, > 1 means ours gives fewer tokens)"
    )
    print("| model     | vocab  | ours  | tokenizers | sentencepiece | tok/ours | spm/ours |")
    print("|-----------|--------|-------|------------|---------------|----------|----------|")
    for model, vocab, r in rows:
        o, h, s = r["ours"], r["hf"], r["spm"]
        print(
            f"| {model:9s} | {vocab:6d} | {_fmt(o, 'tok_per_kchar', '5.1f'):>5s} | {_fmt(h, 'tok_per_kchar', '10.1f'):>10s} | "
            f"{_fmt(s, 'tok_per_kchar', '13.1f'):>13s} | {_ratio(h, o, 'tok_per_kchar', '.3f'):>8s} | "
            f"{_ratio(s, o, 'tok_per_kchar', '.3f'):>8s} |"
        )
    print()
    print(
        f"Encoding (MB/s of UTF-8 text, median of {args.repeats}; ours and tokenizers load the same tokenizer.json "
        f"(ours, vocab {min(args.vocab_sizes)}); sentencepiece its own model; ratio = ours / tokenizers; 1t columns "
        f"CPU clock, 2-way columns wall clock; last column: our 2-process / 1-process wall-clock speed, same run)"
    )
    print(
        "| model     | ours 1t | tok 1t | spm 1t | ours/tok 1t | ours 2p | tok 2t | spm 2t | ours/tok 2 | ours 2p/1p wall |"
    )
    print(
        "|-----------|---------|--------|--------|-------------|---------|--------|--------|------------|-----------------|"
    )
    for model, enc in enc_rows:

        def g(lib, t):
            return enc.get((lib, t))

        def ratio(t):  # throughput: ours / theirs
            return _ratio(g("ours", t), g("hf", t), "mb_per_s")

        print(
            f"| {model:9s} | {_fmt(g('ours', 1), 'mb_per_s', '7.2f'):>7s} | {_fmt(g('hf', 1), 'mb_per_s', '6.2f'):>6s} | "
            f"{_fmt(g('spm', 1), 'mb_per_s', '6.2f'):>6s} | {ratio(1):>11s} | {_fmt(g('ours', 2), 'mb_per_s', '7.2f'):>7s} | "
            f"{_fmt(g('hf', 2), 'mb_per_s', '6.2f'):>6s} | {_fmt(g('spm', 2), 'mb_per_s', '6.2f'):>6s} | {ratio(2):>10s} | "
            f"{_fmt(g('ours', 2), 'speedup', '15.2f'):>15s} |"
        )
    print(f"\ntotal {time.perf_counter() - t0:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
