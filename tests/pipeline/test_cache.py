"""Stage keys: contents, not paths; excluded fields; chained dependencies; the changed-field explanation."""

from posttrain.pipeline import cache
from posttrain.trainers.sft import SFTConfig


def test_a_key_digests_bytes_not_paths(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "sub" / "other_name.jsonl"
    b.parent.mkdir()
    a.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n')
    b.write_bytes(a.read_bytes())
    ka = cache.key_of(cache.key_fields("sft", SFTConfig(data=str(a)), {"data": a}, {}, 0))
    kb = cache.key_of(cache.key_fields("sft", SFTConfig(data=str(b), out="elsewhere"), {"data": b}, {}, 0))
    assert ka == kb
    b.write_bytes(b'{"prompt": "1+1=", "answer": "3"}\n')
    fields = cache.key_fields("sft", SFTConfig(data=str(b)), {"data": b}, {}, 0)
    assert cache.key_of(fields) != ka
    assert cache.changed_fields(cache.key_fields("sft", SFTConfig(), {"data": a}, {}, 0), fields) == [
        "inputs.data changed"
    ]


def test_excluded_fields_do_not_change_the_key_and_the_rest_do():
    base = cache.key_fields("sft", SFTConfig(), {}, {"tokenizer": "k1"}, 0)
    same = cache.key_fields(
        "sft",
        SFTConfig(out="x", threads=2, progress=False, logger="tensorboard", keep_checkpoints=5),
        {},
        {"tokenizer": "k1"},
        0,
    )
    assert cache.key_of(base) == cache.key_of(same)
    for other, why in (
        (cache.key_fields("sft", SFTConfig(steps=7), {}, {"tokenizer": "k1"}, 0), "config.steps 600 -> 7"),
        (cache.key_fields("sft", SFTConfig(), {}, {"tokenizer": "k2"}, 0), "deps.tokenizer changed"),
        (cache.key_fields("sft", SFTConfig(), {}, {"tokenizer": "k1"}, 1), "seed 0 -> 1"),
    ):
        assert cache.key_of(other) != cache.key_of(base)
        assert cache.changed_fields(base, other) == [why]


def test_directory_digest_covers_names_and_bytes(tmp_path):
    d = tmp_path / "model"
    d.mkdir()
    (d / "w.bin").write_bytes(b"abc")
    first = cache.digest_path(d)
    (d / ".w.bin.1234.tmp").write_bytes(b"junk")  # a killed writer's temp file is not content
    assert cache.digest_path(d) == first
    (d / "w.bin").rename(d / "v.bin")
    assert cache.digest_path(d) != first


def test_done_file_is_read_back_and_a_torn_one_counts_as_absent(tmp_path):
    cache.write_done(tmp_path, "k", {"seed": 0}, {"acc": 0.5}, 1.25, 10.0, "run")
    assert cache.read_done(tmp_path)["summary"] == {"acc": 0.5}
    (tmp_path / cache.DONE_FILE).write_text('{"key": "k", "summ')
    assert cache.read_done(tmp_path) is None


def test_the_code_enters_the_key(tmp_path, monkeypatch):
    """An edited posttrain source tree changes every stage key (a stale stage is never reused across code)."""
    import shutil

    pkg = tmp_path / "posttrain"
    shutil.copytree(cache.PACKAGE_DIR, pkg, ignore=shutil.ignore_patterns("__pycache__"))
    before = cache.code_digest(pkg)
    assert before == cache.code_digest(cache.PACKAGE_DIR)  # the same bytes under another path: the same digest
    (pkg / "__pycache__").mkdir(exist_ok=True)
    (pkg / "__pycache__" / "x.cpython-311.py").write_text("junk")  # not source
    (pkg / "notes.txt").write_text("not a .py file")
    assert cache.code_digest.__wrapped__(pkg) == before
    trainer = pkg / "trainers" / "sft.py"
    trainer.write_text(trainer.read_text() + "\n# an edit\n")
    edited = cache.code_digest.__wrapped__(pkg)
    assert edited != before
    base = cache.key_fields("sft", SFTConfig(), {}, {}, 0)
    monkeypatch.setattr(cache, "code_digest", lambda: edited)
    other = cache.key_fields("sft", SFTConfig(), {}, {}, 0)
    assert cache.key_of(other) != cache.key_of(base) and cache.changed_fields(base, other) == [
        f"code {base['code']!r} -> {edited!r}"
    ]
