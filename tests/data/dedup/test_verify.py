"""Candidate verification: the borderline band, exact Jaccard, chunked re-reads, and the default banding.

Oracles: hand-computed band edges, Python string sets (shingles.jaccard), datasketch's (b, r) choice,
and pairs constructed so that the MinHash estimate is on the wrong side of the threshold."""

import importlib
import json
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.data.dedup.cluster import pair_chunks as _pair_chunks
from posttrain.data.dedup.lsh import borderline, exact_jaccard, plan_bands, sorted_set
from posttrain.data.dedup.minhash import oph_signatures
from posttrain.data.dedup.run import DedupConfig, dedup
from posttrain.data.dedup.shingles import char_shingles, jaccard, normalize, shingle_strings
from posttrain.errors import ConfigError


def test_borderline_band_edges():
    # t=0.8, K=128: s.d. = sqrt(0.16/128) = 0.0353553; 3 s.d. = 0.1060660 -> band [0.693934, 0.906066]
    est = np.array([0.69, 0.694, 0.75, 0.8, 0.85, 0.906, 0.907, 1.0])
    assert borderline(est, 0.8, 128, 3.0).tolist() == [False, True, True, True, True, True, False, False]
    assert borderline(est, 0.8, 128, 0.0).tolist() == [False, False, False, True, False, False, False, False]


@given(st.lists(st.integers(0, 2**64 - 1), max_size=50))
def test_sorted_set_matches_python_sorted_set(xs):
    got = sorted_set(np.array(xs, np.uint64))
    assert got.dtype == np.uint64 and got.tolist() == sorted(set(xs))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet="abcde ", min_size=0, max_size=40), min_size=2, max_size=6))
def test_exact_jaccard_matches_string_sets(texts):
    texts = [t for t in texts if t]
    if len(texts) < 2:
        return
    h, off = char_shingles(texts, 3)
    sets = {i: sorted_set(h[off[i] : off[i + 1]]) for i in range(len(texts))}
    pairs = np.array([(i, j) for i in range(len(texts)) for j in range(i + 1, len(texts))])
    got = exact_jaccard(sets, pairs)
    want = [jaccard(shingle_strings(texts[i], 3), shingle_strings(texts[j], 3)) for i, j in pairs]
    np.testing.assert_allclose(got, want)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 30)), max_size=60), st.integers(2, 10))
def test_pair_chunks_cover_in_order_with_bounded_docs(pairs, max_docs):
    pairs = np.array(pairs, np.int64).reshape(-1, 2)
    chunks = _pair_chunks(pairs, max_docs)
    if not len(pairs):
        assert chunks == []
        return
    assert [s for s, _ in chunks] == [0] + [e for _, e in chunks[:-1]]  # contiguous
    assert chunks[-1][1] == len(pairs)
    for s, e in chunks:
        assert e > s and len(set(pairs[s:e].ravel().tolist())) <= max_docs


def test_default_banding_is_datasketchs_choice_for_the_weights():
    from datasketch.lsh import _optimal_param

    cfg = DedupConfig()
    plan = plan_bands(cfg.threshold, cfg.num_perm, fn_weight=cfg.fn_weight)
    assert (plan.bands, plan.rows) == _optimal_param(0.8, 128, 1 - cfg.fn_weight, cfg.fn_weight) == (18, 7)
    with pytest.raises(ConfigError):
        DedupConfig(borderline_sd=-1.0)


def _wrong_side_pair(want_above: bool, seed: int = 0) -> tuple[str, str, float, float]:
    """Two texts whose exact 5-gram Jaccard is on one side of 0.8 and whose OPH estimate (K=128, seed 1)
    is on the other: want_above -> exact in [0.8, 0.84) but estimate < 0.8, else exact in [0.76, 0.8) and
    estimate >= 0.8. Found by random word edits (the estimator's s.d. here is ~0.035)."""
    rng = random.Random(seed)
    words = [f"w{rng.randrange(5000)}" for _ in range(250)]
    base = " ".join(words)
    for _ in range(2000):
        w = list(words)
        for _ in range(rng.randint(15, 22)):  # ~0.76-0.84 for 250 six-character words
            w[rng.randrange(len(w))] = f"x{rng.randrange(10**6)}"
        other = " ".join(w)
        j = jaccard(shingle_strings(base), shingle_strings(other))
        if not ((0.8 <= j < 0.84) if want_above else (0.76 <= j < 0.8)):
            continue
        h, off = char_shingles([base, other], 5)
        sig = oph_signatures(h, off, 128, 1)
        est = float((sig[0] == sig[1]).mean())
        if (est < 0.8) == want_above:
            return base, other, j, est
    raise AssertionError("no wrong-side pair found")


@pytest.mark.parametrize("exact_above", [True, False])
def test_borderline_fixes_estimates_on_the_wrong_side(tmp_path, exact_above):
    a, b, j, est = _wrong_side_pair(exact_above)
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in (a, b)))
    reps = {}
    for verify in ("estimate", "borderline", "exact"):
        # bands/rows (32, 4): the pair is a candidate whenever est >= 0.75, so only verification decides
        cfg = DedupConfig(verify=verify, bands=32, rows=4, workers=1, progress=False)
        stats = dedup([inp], tmp_path / f"{verify}.jsonl", cfg, clusters=tmp_path / f"{verify}.clusters.jsonl")
        assert stats["candidate_pairs"] == 1
        reps[verify] = [
            json.loads(x)["representative"] for x in (tmp_path / f"{verify}.clusters.jsonl").read_text().splitlines()
        ]
        if verify == "borderline":
            assert stats["exact_checked_pairs"] == 1
            assert stats["exact_flipped"] == {"accepted": int(exact_above), "rejected": int(not exact_above)}
    merged = [0, 0]
    assert reps["estimate"] == ([0, 1] if exact_above else merged)  # the estimate is on the wrong side
    assert reps["borderline"] == reps["exact"] == (merged if exact_above else [0, 1])


def test_borderline_rereads_in_chunks(tmp_path, monkeypatch):
    D = importlib.import_module("posttrain.data.dedup.cluster")

    rng = random.Random(3)
    base = [" ".join(f"w{rng.randrange(5000)}" for _ in range(120)) for _ in range(6)]
    texts = []
    for t in base:  # each base and three edited copies, J ~ 0.75-0.95 to the base
        texts.append(t)
        for _ in range(3):
            w = t.split()
            for _ in range(rng.randint(1, 4)):
                w[rng.randrange(len(w))] = f"x{rng.randrange(10**6)}"
            texts.append(" ".join(w))
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    cfg = DedupConfig(verify="exact", workers=1, progress=False)
    full = dedup([inp], tmp_path / "a.jsonl", cfg, clusters=tmp_path / "a.c.jsonl")
    monkeypatch.setattr(D, "EXACT_MAX_DOCS", 2)
    small = dedup([inp], tmp_path / "b.jsonl", cfg, clusters=tmp_path / "b.c.jsonl")
    assert (tmp_path / "a.c.jsonl").read_text() == (tmp_path / "b.c.jsonl").read_text()
    assert full["verified_pairs_exact"] == small["verified_pairs_exact"] > 0
    # exact verification accepts exactly the candidates whose string-set Jaccard is >= 0.8
    norm = [normalize(t) for t in texts]
    sets = [shingle_strings(t) for t in norm]
    labels = [json.loads(x)["representative"] for x in (tmp_path / "a.c.jsonl").read_text().splitlines()]
    for i in range(len(texts)):
        for k in range(i + 1, len(texts)):
            if jaccard(sets[i], sets[k]) >= 0.8:
                assert labels[i] == labels[k]


def test_cli_verify_flags(tmp_path, capsys):
    from posttrain.cli import main as cli_main

    a, b, _, _ = _wrong_side_pair(True)  # exact >= 0.8, estimate < 0.8
    inp = tmp_path / "in.jsonl"
    inp.write_text("".join(json.dumps({"text": t}) + "\n" for t in (a, b)))
    common = ["dedup", str(inp), "--workers", "1", "--no-progress", "--bands", "32", "--rows", "4"]
    assert cli_main([*common, "--output", str(tmp_path / "e.jsonl"), "--verify", "estimate"]) == 0
    assert "kept: 2" in capsys.readouterr().out
    assert (
        cli_main([*common, "--output", str(tmp_path / "n.jsonl"), "--borderline-sd", "0"]) == 0
    )  # band of width 0: estimate only
    assert "kept: 2" in capsys.readouterr().out
    assert cli_main([*common, "--output", str(tmp_path / "b.jsonl")]) == 0  # default: borderline, 3 s.d.
    out = capsys.readouterr().out
    assert "kept: 1" in out and "(1 by exact Jaccard)" in out
    assert cli_main([*common, "--output", str(tmp_path / "x.jsonl"), "--borderline-sd", "-1"]) == 2
