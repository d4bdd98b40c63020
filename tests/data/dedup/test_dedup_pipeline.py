"""End-to-end dedup: clusters, properties (hypothesis), bad lines, formats, chat keys, backends, CLI."""

import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.cli import main as cli_main
from posttrain.data.dedup.run import DedupConfig, dedup
from posttrain.errors import ConfigError, DataError

BASE = [
    "The committee approved the annual budget after a long debate about school funding and roads.",
    "A recipe for bread: mix flour, water, salt and yeast, knead for ten minutes, then let it rise.",
    "Researchers observed that the migratory birds returned two weeks earlier than in previous years.",
    "The new library opens on Monday with a reading room, a cafe and a collection of rare maps.",
]


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _corpus(tmp_path):
    recs = [{"id": f"d{i}", "text": t} for i, t in enumerate(BASE)]
    recs.append({"id": "copy0", "text": BASE[0]})
    recs.append({"id": "case1", "text": BASE[1].upper()})
    recs.append({"id": "edit2", "text": BASE[2].replace("two weeks", "three weeks")})
    return _write(tmp_path / "in.jsonl", recs)


def _run(tmp_path, inp, **kw):
    cfg = DedupConfig(id_field=kw.pop("id_field", "id"), progress=False, workers=kw.pop("workers", 1), **kw)
    out = tmp_path / "out.jsonl"
    stats = dedup([inp], out, cfg, clusters=tmp_path / "clusters.jsonl", stats_path=tmp_path / "stats.json")
    clusters = {
        r["id"]: r["representative"] for r in map(json.loads, (tmp_path / "clusters.jsonl").read_text().splitlines())
    }
    kept = [json.loads(x) for x in out.read_text().splitlines()]
    return stats, clusters, kept


@pytest.mark.parametrize("method", ["minhash", "simhash", "exact"])
def test_clusters_and_outputs(tmp_path, method):
    # a one-word edit of a 95-character text flips 4-11 of 64 SimHash bits depending on the seed (measured), hence 12
    extra = {"hamming": 12} if method == "simhash" else {}
    stats, clusters, kept = _run(tmp_path, _corpus(tmp_path), method=method, **extra)
    assert clusters["copy0"] == "d0" and clusters["case1"] == "d1"
    if method != "exact":
        assert clusters["edit2"] == "d2"
    assert [r["id"] for r in kept] == [k for k, v in clusters.items() if k == v]
    assert stats["documents_in"] == 7 and stats["kept"] == len(kept)
    saved = json.loads((tmp_path / "stats.json").read_text())
    assert saved["removed"][method] == 7 - len(kept)
    assert sum(int(s) * c for s, c in saved["cluster_size_histogram"].items()) == 7


def test_exact_bloom_mode(tmp_path):
    stats, clusters, kept = _run(tmp_path, _corpus(tmp_path), method="exact", bloom=True)
    assert clusters["copy0"] is None and clusters["d0"] == "d0"
    assert len(kept) == 5 and clusters["case1"] is None and stats["bloom"]["bytes"] > 0


def test_bad_lines_error_and_skip(tmp_path):
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"id": "a", "text": "hello world"}\n[1, 2]\n\n{"id": "b"}\n{"id": "c", "text": "hello world"}\n')
    with pytest.raises(DataError, match=r"in\.jsonl:2: expected a JSON object"):
        _run(tmp_path, inp)
    stats, clusters, kept = _run(tmp_path, inp, on_bad_line="skip", rejects=str(tmp_path / "rej.jsonl"))
    assert stats["bad_lines"] == 2
    assert (tmp_path / "rej.jsonl").read_text() == '[1, 2]\n{"id": "b"}\n'
    assert clusters == {"a": "a", "c": "a"} and [r["id"] for r in kept] == ["a"]


def test_duplicate_ids_and_bad_config(tmp_path):
    inp = _write(tmp_path / "in.jsonl", [{"id": 1, "text": "x"}, {"id": 1, "text": "y"}])
    with pytest.raises(DataError, match="more than once"):
        _run(tmp_path, inp)
    with pytest.raises(ConfigError):
        DedupConfig(threshold=1.5)
    with pytest.raises(ConfigError):
        DedupConfig(normalize="lower,bogus")


def _near_dup(rng, text):
    w = text.split()
    op = rng.choice(["copy", "edit", "case", "trunc", "punct"])
    if op == "edit":
        w[rng.randrange(len(w))] = "zebra"
    elif op == "case":
        w = [x.upper() for x in w]
    elif op == "trunc":
        w = w[: max(1, len(w) - 1)]
    elif op == "punct":
        w = [x + "," for x in w]
    return " ".join(w)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(0, 10**6), st.sampled_from(["minhash", "simhash", "exact"]))
def test_every_id_maps_to_a_kept_representative_and_idempotent(tmp_path, seed, method):
    rng = random.Random(seed)
    vocab = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho".split()
    docs = [" ".join(rng.choice(vocab) for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(1, 12))]
    docs += [_near_dup(rng, rng.choice(docs) or "x") for _ in range(rng.randint(0, 8))]
    rng.shuffle(docs)
    inp = _write(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(docs)])
    _, clusters, kept = _run(tmp_path, inp, method=method, threshold=0.7)
    kept_ids = {r["id"] for r in kept}
    assert set(clusters) == set(range(len(docs)))
    assert all(rep in kept_ids for rep in clusters.values())
    assert all(clusters[i] <= i for i in clusters)  # representative = first of its cluster
    # deduplicating the output again removes nothing
    again = _write(tmp_path / "again.jsonl", kept)
    stats2 = dedup(
        [again],
        tmp_path / "out2.jsonl",
        DedupConfig(id_field="id", method=method, threshold=0.7, progress=False, workers=1),
    )
    assert stats2["kept"] == len(kept)


def test_workers_and_batch_size_do_not_change_clusters(tmp_path):
    rng = random.Random(0)
    docs = [" ".join(rng.choice(BASE).split()[: rng.randint(5, 16)]) for _ in range(300)]
    inp = _write(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(docs)])
    _, c1, _ = _run(tmp_path, inp, workers=1, batch_size=1000)
    _, c2, _ = _run(tmp_path, inp, workers=2, batch_size=17)
    assert c1 == c2 and len(set(c1.values())) < 300


def test_parquet_in_and_out(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    recs = [{"id": f"p{i}", "text": t, "n": i} for i, t in enumerate(BASE + [BASE[3]])]
    pq.write_table(pa.Table.from_pylist(recs), tmp_path / "in.parquet")
    stats = dedup(
        [tmp_path / "in.parquet"],
        tmp_path / "out.parquet",
        DedupConfig(id_field="id", progress=False, workers=1),
        clusters=tmp_path / "c.jsonl",
    )
    out = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert out == recs[:4] and stats["kept"] == 4


def test_chat_and_preference_keys(tmp_path):
    q = "What is the capital of France and why did it become the capital?"
    recs = [
        {
            "messages": [
                {"role": "user", "content": q},
                {"role": "assistant", "content": "Paris, for historical reasons."},
            ]
        },
        {
            "messages": [
                {"role": "user", "content": q},
                {"role": "assistant", "content": "It is Paris; the kings lived there."},
            ]
        },
        {"prompt": q, "chosen": "Paris, for historical reasons.", "rejected": "Lyon."},
    ]
    inp = _write(tmp_path / "chat.jsonl", recs)
    by_prompt = _run(tmp_path, inp, key="prompt", id_field=None)[1]
    by_conv = _run(tmp_path, inp, key="conversation", id_field=None)[1]
    assert by_prompt == {0: 0, 1: 0, 2: 0}  # same question in chat and preference format
    assert by_conv[1] == 1  # different answers keep the conversations apart


def test_units_and_contamination_in_one_run(tmp_path):
    footer = "Subscribe to our newsletter for weekly updates on local news and events."
    recs = [{"id": i, "text": f"{t}\n\n{footer}"} for i, t in enumerate(BASE)]
    inp = _write(tmp_path / "in.jsonl", recs)
    ev = _write(
        tmp_path / "eval.jsonl",
        [{"question": BASE[2]}, {"question": "an unrelated question about chemistry and physics today"}],
    )
    stats, clusters, kept = _run(
        tmp_path, inp, units="paragraph", contamination=(str(ev),), drop_contaminated=True, contamination_ngram=8
    )
    assert [r["id"] for r in kept] == [0, 1, 3]
    assert kept[0]["text"].endswith(footer) and footer not in kept[1]["text"]
    assert stats["units_removed"] == 2 and stats["removed"]["contamination"] == 1
    c = stats["contamination"]
    assert c["contaminated_eval_items"] == 1 and c["items"][0]["training_ids"] == [2]


def test_ray_backend_matches_local(tmp_path):
    ray = pytest.importorskip("ray")
    rng = random.Random(1)
    docs = [" ".join(rng.choice(BASE).split()[: rng.randint(5, 16)]) for _ in range(200)]
    inp = _write(tmp_path / "in.jsonl", [{"id": i, "text": t} for i, t in enumerate(docs)])
    _, local, _ = _run(tmp_path, inp, workers=2, batch_size=50)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        _, remote, _ = _run(tmp_path, inp, backend="ray", batch_size=50)
    finally:
        ray.shutdown()
    assert remote == local


def test_cli_smoke(tmp_path, capsys):
    inp = _corpus(tmp_path)
    rc = cli_main(
        [
            "dedup",
            str(inp),
            "--output",
            str(tmp_path / "o.jsonl"),
            "--id-field",
            "id",
            "--workers",
            "1",
            "--clusters",
            str(tmp_path / "c.jsonl"),
            "--normalize",
            "nfkc,lower,whitespace",
            "--no-progress",
        ]
    )
    assert rc == 0
    out = capsys.readouterr().out
    assert "kept: 4" in out and "LSH: b=" in out
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 7
    rc = cli_main(["dedup", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path / "o.jsonl")])
    assert rc == 2 and "not found" in capsys.readouterr().err


def test_cli_empty_input_warns(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    rc = cli_main(["dedup", str(tmp_path / "empty.jsonl"), "--output", str(tmp_path / "o.jsonl"), "--no-progress"])
    assert rc == 0 and (tmp_path / "o.jsonl").read_text() == ""
    assert "warning: no documents in" in capsys.readouterr().err


@pytest.mark.parametrize("bloom", [False, True])
def test_line_units(tmp_path, bloom):
    recs = [{"id": i, "text": f"{BASE[i]}\nCookie notice: we use cookies.\n{i}"} for i in range(3)]
    stats, _, kept = _run(tmp_path, _write(tmp_path / "in.jsonl", recs), units="line", bloom=bloom)
    assert [r["text"].count("Cookie notice") for r in kept] == [1, 0, 0]
    assert stats["units_removed"] == 2 and kept[2]["text"] == f"{BASE[2]}\n2"


def test_verify_exact_uses_true_jaccard(tmp_path):
    from posttrain.data.dedup.shingles import jaccard, normalize, shingle_strings

    stats, clusters, _ = _run(tmp_path, _corpus(tmp_path), verify="exact")
    assert clusters["copy0"] == "d0" and clusters["edit2"] == "d2"
    a, b = (normalize(t) for t in (BASE[2], BASE[2].replace("two weeks", "three weeks")))
    assert jaccard(shingle_strings(a), shingle_strings(b)) >= 0.8
    assert stats["verified_pairs_exact"] == 3  # copy0~d0, case1~d1, edit2~d2
