"""Property tests: arbitrary bytes and arbitrary JSON records, fed to every loader, give a correct result
or a UserError/DataError, never another exception.

Loaders: SFT demonstrations and evaluation prompts (``load_pairs`` + the load-time checks), preference
pairs (DPO/RM) and KTO examples (+ ``fit_pairs``/``fit_kto``), the tokenizer corpus reader, the dedup
reader and the config file loader. Where the result is simple to state (SFT pairs, preference pairs,
corpus texts, dedup line accounting) it is compared with an oracle written here from the file formats.
GRPO has no user data loader (its prompts come from the embedded task), so it has nothing to fuzz.
"""

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from posttrain.data.demos import fit_demos
from posttrain.data.pairs import load_pairs
from posttrain.data.preference import fit_kto, fit_pairs, load_kto_examples, load_preference_pairs
from posttrain.errors import UserError
from posttrain.evaluation import fit_prompts
from posttrain.tasks.arithmetic import ALPHABET
from posttrain.tokenizers.char import CharTokenizer
from posttrain.tokenizers.corpus import iter_texts

TOK = CharTokenizer(ALPHABET)
FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


class Window:
    def __init__(self, n):
        self.config = type("C", (), {"max_seq_len": n})()


scalars = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True) | st.text(max_size=6)
values = st.recursive(
    scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=6
)
texts = st.text(ALPHABET, max_size=12) | st.text(max_size=12) | st.text(ALPHABET, min_size=60, max_size=90)
field = texts | values
records = st.fixed_dictionaries(
    {},
    optional={
        "prompt": field,
        "answer": field | st.integers(-999, 999),
        "chosen": field,
        "rejected": field,
        "completion": field,
        "label": st.booleans() | st.sampled_from([0, 1, 2, "yes", None]),
        # finite margins only: a NaN/inf margin is another branch's check, and the oracle must not depend on it
        "margin": st.none() | st.floats(-1e6, 1e6) | st.integers(-99, 99) | st.text(max_size=2) | st.booleans(),
        "text": field,
        "messages": values,
    },
)
# well-formed records of each format, mixed with arbitrary ones so that both the result and the errors are reached
sft_records = st.fixed_dictionaries(
    {"prompt": texts, "answer": texts | st.integers(-999, 999) | st.floats()}, optional={"extra": values}
)
pair_records = st.builds(
    lambda p, c, r, m: {"prompt": p, "chosen": c, "rejected": r, **m},
    texts,
    texts,
    texts,
    st.fixed_dictionaries({}, optional={"margin": st.floats(-1e6, 1e6) | st.integers(-99, 99)}),
).filter(lambda r: r["chosen"] != r["rejected"])
kto_records = st.fixed_dictionaries({"prompt": texts, "completion": texts, "label": st.booleans()})
text_records = st.fixed_dictionaries({"text": texts}, optional={"meta": values})


def mixed(good):
    """Lists of well-formed records (half the time), or of mostly well-formed ones with arbitrary ones mixed in."""
    return st.lists(good, max_size=5) | st.lists(st.one_of(good, good, good, good, records | values), max_size=6)


json_lines = st.lists(records | values, max_size=6).map(lambda rs: [json.dumps(r).encode() for r in rs])
byte_lines = st.lists(
    st.binary(max_size=24)
    | st.sampled_from([b"", b"  ", b'{"prompt": "1+1=", "answer": "2"}', b"\xff\xfe", b"[", b"1" * 4400]),
    max_size=6,
)


def _write(tmp_path, lines, name="d.jsonl"):
    p = tmp_path / name
    p.write_bytes(b"\n".join(lines) + (b"\n" if lines else b""))
    return p


def _clean(fn):
    """fn() -> (result, None) or (None, the UserError); any other exception propagates (the test fails)."""
    try:
        return fn(), None
    except UserError as e:
        assert "\n" not in str(e) and str(e)
        return None, e


def _expected_sft(recs):
    out = []
    for i, r in enumerate(recs, 1):
        ok = (
            isinstance(r, dict)
            and "prompt" in r
            and "answer" in r
            and isinstance(r["prompt"], str)
            and not isinstance(r["answer"], bool)
            and isinstance(r["answer"], (str, int, float))
        )
        if not ok:
            return i
        out.append((r["prompt"], str(r["answer"])))
    return out


@FUZZ
@given(recs=mixed(sft_records), long=st.sampled_from(["error", "skip", "truncate"]))
def test_sft_and_eval_loaders_on_arbitrary_json(tmp_path, recs, long):
    p = _write(tmp_path, [json.dumps(r).encode() for r in recs])
    want = _expected_sft(recs)
    got, err = _clean(lambda: load_pairs(str(p), "training"))
    if isinstance(want, int):
        assert err is not None and str(err).startswith(f"{p}:{want}: ")
        return
    if not want:
        assert str(err) == f"{p}: no training records (the file is empty)"
        return
    assert err is None and list(got) == want and got.lines == list(range(1, len(want) + 1))
    fitted, err = _clean(lambda: fit_demos(TOK, got, Window(64), long))
    if err is None:
        demos, ids, mask = fitted
        assert ids.shape[0] == len(demos) > 0 and ids.shape[1] <= 64 and mask.shape == ids.shape
        assert long != "skip" or all(d in want for d in demos)
    prompts, err = _clean(lambda: fit_prompts(TOK, got, model=Window(64), max_new_tokens=8, long=long))
    if err is None:
        assert 0 < len(prompts) <= len(want)


def _expected_pairs(recs):
    out = []
    for i, r in enumerate(recs, 1):
        if not (isinstance(r, dict) and all(isinstance(r.get(k), str) for k in ("prompt", "chosen", "rejected"))):
            return i
        m = r.get("margin")
        if r["chosen"] == r["rejected"] or (m is not None and (isinstance(m, bool) or not isinstance(m, (int, float)))):
            return i
        out.append((r["prompt"], r["chosen"], r["rejected"], None if m is None else float(m)))
    return out


@FUZZ
@given(recs=mixed(pair_records) | mixed(kto_records), long=st.sampled_from(["error", "skip", "truncate"]))
def test_preference_loaders_on_arbitrary_json(tmp_path, recs, long):
    p = _write(tmp_path, [json.dumps(r).encode() for r in recs])
    want = _expected_pairs(recs)
    got, err = _clean(lambda: load_preference_pairs(p))
    if isinstance(want, int):
        assert err is not None and str(err).startswith(f"{p}:{want}: ")
    elif not want:
        assert err is not None and str(err).startswith(f"{p}: no usable records")
    else:
        assert err is None and [(x.prompt, x.chosen, x.rejected, x.margin) for x in got] == want
        fitted, err = _clean(lambda: fit_pairs(got, TOK, window=64, long=long))
        if err is None:
            assert all(len(x.tokens[0]) + max(len(x.tokens[1]), len(x.tokens[2])) <= 64 for x in fitted)
    kto, err = _clean(lambda: load_kto_examples(p))
    if err is None:
        _clean(lambda: fit_kto(kto, TOK, window=64, long=long))


@FUZZ
@given(lines=byte_lines | json_lines)
def test_every_jsonl_loader_on_arbitrary_bytes(tmp_path, lines):
    p = _write(tmp_path, lines)
    _clean(lambda: fit_demos(TOK, load_pairs(str(p), "training"), Window(64), "skip"))
    _clean(lambda: load_preference_pairs(p))
    _clean(lambda: load_kto_examples(p))
    _clean(lambda: list(iter_texts([p], text_field="text")))


@FUZZ
@given(data=st.binary(max_size=80) | st.lists(st.binary(max_size=10) | st.just(b"\r")).map(b"\n".join))
def test_corpus_reader_plain_text_is_exact(tmp_path, data):
    p = tmp_path / "c.txt"
    p.write_bytes(data)
    pieces = data.split(b"\n")
    raw = [x + b"\n" for x in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])
    assert list(iter_texts([p])) == [x.decode("utf-8", "replace").rstrip("\r\n") for x in raw]


@FUZZ
@given(recs=mixed(text_records))
def test_corpus_reader_text_field(tmp_path, recs):
    p = _write(tmp_path, [json.dumps(r).encode() for r in recs])
    got, err = _clean(lambda: list(iter_texts([p], text_field="text")))
    if all(isinstance(r, dict) and isinstance(r.get("text"), str) for r in recs):
        assert got == [r["text"] for r in recs]
    else:
        bad = next(i for i, r in enumerate(recs, 1) if not (isinstance(r, dict) and isinstance(r.get("text"), str)))
        assert str(err).startswith(f"{p}:{bad}: ")


@FUZZ
@given(
    lines=byte_lines | json_lines | mixed(text_records).map(lambda rs: [json.dumps(r).encode() for r in rs]),
    on_bad=st.sampled_from(["error", "skip"]),
)
def test_dedup_reader(tmp_path, lines, on_bad):
    from posttrain.data.dedup.run import DedupConfig, dedup

    p = _write(tmp_path, lines)
    cfg = DedupConfig(workers=1, progress=False, on_bad_line=on_bad, rejects=str(tmp_path / "rej.jsonl"))
    s, err = _clean(lambda: dedup([p], tmp_path / "out.jsonl", cfg))
    if on_bad == "skip":
        assert err is None
        # count the file's own lines: a generated "line" may itself hold a newline (b"\x00\n\x00" is two)
        written = p.read_bytes().split(b"\n")
        assert s["documents_in"] + s["bad_lines"] == sum(1 for x in written if x.strip())


@FUZZ
@given(
    doc=st.dictionaries(
        st.sampled_from(
            ["steps", "lr", "model", "task", "data", "progress", "nope", "long", "threads", "max_new_tokens"]
        ),
        values,
        max_size=4,
    ),
    raw=st.binary(max_size=40),
    suffix=st.sampled_from([".yaml", ".toml"]),
)
def test_config_file_loader(tmp_path, doc, raw, suffix):
    from posttrain.config import build_config
    from posttrain.trainers.sft import SFTConfig

    p = tmp_path / "c.yaml"
    p.write_text(json.dumps(doc))
    cfg, err = _clean(lambda: build_config(SFTConfig, file=p))
    v = doc.get("data")
    if isinstance(v, (bool, list, dict)):  # a path field never takes the str() of a container or a boolean
        assert err is not None
    elif err is None:
        assert cfg.data == (None if v is None or (isinstance(v, str) and v.lower() in ("none", "null")) else str(v))
    q = tmp_path / f"r{suffix}"
    q.write_bytes(raw)
    _clean(lambda: build_config(SFTConfig, file=q))


@pytest.mark.parametrize("raw", [b"\xff\xfe: 1\n", b"steps: [\n", b"!!python/object:os.system {}\n"])
def test_config_file_loader_examples(tmp_path, raw):
    from posttrain.config import build_config
    from posttrain.trainers.sft import SFTConfig

    p = tmp_path / "c.yaml"
    p.write_bytes(raw)
    with pytest.raises(UserError):
        build_config(SFTConfig, file=p)
