"""Preference data: JSONL loaders with file:line errors, the [prompt | completion] layout, and log-probs over it."""

from __future__ import annotations

import json

import pytest
import torch

from posttrain.data.io import ReadStats
from posttrain.data.preference import (
    KTOExample,
    PreferencePair,
    collate_kto,
    collate_preference,
    load_kto_examples,
    load_preference_pairs,
    pack_prompt_completion,
    pairs_to_kto,
)
from posttrain.errors import DataError
from posttrain.tokenizers.char import CharTokenizer

TOK = CharTokenizer("0123456789+-=")  # <pad>=0 <bos>=1 <eos>=2 <unk>=3, digit d -> 4 + d, '+'=14 '-'=15 '='=16


def write_jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8")
    return path


# ---------------------------------------------------------------------------------------------
# loaders


def test_load_pairs_with_optional_margin(tmp_path):
    p = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "1+1=", "chosen": "2", "rejected": "3"},
        "",
        {"prompt": "2+2=", "chosen": "4", "rejected": "5", "margin": 1.5, "extra": "ignored"},
    ])  # fmt: skip
    pairs = load_preference_pairs(p)
    assert pairs == [PreferencePair("1+1=", "2", "3"), PreferencePair("2+2=", "4", "5", 1.5)]


@pytest.mark.parametrize(
    "row,message",
    [
        ({"prompt": "1+1=", "chosen": "2"}, "missing field 'rejected'"),
        ({"chosen": "2", "rejected": "3"}, "missing field 'prompt'"),
        ({"prompt": "1+1=", "chosen": 2, "rejected": "3"}, "field 'chosen' must be a string, got int"),
        ({"prompt": "1+1=", "chosen": "2", "rejected": "2"}, "identical"),
        ({"prompt": "1+1=", "chosen": "2", "rejected": "3", "margin": "big"}, "field 'margin' must be a number"),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "not valid JSON"),
    ],
)
def test_pair_errors_name_file_line_and_field(tmp_path, row, message):
    p = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "1+1=", "chosen": "2", "rejected": "3"}, row])
    with pytest.raises(DataError) as e:
        load_preference_pairs(p)
    assert f"{p}:2:" in str(e.value) and message in str(e.value)


def test_pairs_skip_policy_counts_bad_lines(tmp_path):
    p = write_jsonl(tmp_path / "p.jsonl", [
        {"prompt": "a", "chosen": "1", "rejected": "2"},
        {"prompt": "b", "chosen": 1, "rejected": "2"},
        {"prompt": "c", "chosen": "1"},
        {"prompt": "d", "chosen": "3", "rejected": "4"},
    ])  # fmt: skip
    stats = ReadStats()
    pairs = load_preference_pairs(p, on_bad_line="skip", stats=stats)
    assert [x.prompt for x in pairs] == ["a", "d"]
    assert sorted(ln for ln, _ in stats.bad_lines) == [2, 3]
    assert stats.records == 2


def test_empty_and_missing_files(tmp_path):
    with pytest.raises(DataError, match="no usable records"):
        load_preference_pairs(write_jsonl(tmp_path / "e.jsonl", []))
    assert load_preference_pairs(write_jsonl(tmp_path / "e2.jsonl", []), allow_empty=True) == []
    with pytest.raises(DataError, match="not found"):
        load_kto_examples(tmp_path / "nope.jsonl")


def test_load_kto_labels(tmp_path):
    p = write_jsonl(tmp_path / "k.jsonl", [
        {"prompt": "1+1=", "completion": "2", "label": True},
        {"prompt": "1+1=", "completion": "3", "label": 0},
    ])  # fmt: skip
    assert load_kto_examples(p) == [KTOExample("1+1=", "2", True), KTOExample("1+1=", "3", False)]
    bad = write_jsonl(tmp_path / "kb.jsonl", [{"prompt": "x", "completion": "y", "label": "good"}])
    with pytest.raises(DataError, match=r"kb.jsonl:1: field 'label' must be true/false"):
        load_kto_examples(bad)
    bad2 = write_jsonl(tmp_path / "kb2.jsonl", [{"prompt": "x", "completion": "y"}])
    with pytest.raises(DataError, match=r"kb2.jsonl:1: missing field 'label'"):
        load_kto_examples(bad2)


def test_pairs_to_kto():
    out = pairs_to_kto([PreferencePair("p", "c", "r")])
    assert out == [KTOExample("p", "c", True), KTOExample("p", "r", False)]


# ---------------------------------------------------------------------------------------------
# layout


def test_pack_prompt_completion_worked_example():
    b = pack_prompt_completion([[1, 5], [1]], [[7, 2], [8, 9, 2]], pad_id=0)
    assert b["input_ids"].tolist() == [[1, 5, 7, 2, 0], [0, 1, 8, 9, 2]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert b["completion_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert b["completion_start"] == 2


def test_collate_preference_layout_char_tokenizer():
    pairs = [PreferencePair("12+3=", "15", "16", 0.5), PreferencePair("1+1=", "2", "11", 1.0)]
    b = collate_preference(pairs, TOK)
    B, P = 2, 6  # longest prompt: <bos> + "12+3=" = 6 tokens
    assert b["completion_start"] == P
    assert b["input_ids"].shape == (2 * B, P + 3)  # longest completion: "11" + <eos> = 3
    # row 0 = prompt 0 + chosen 0; row 3 = prompt 1 + rejected 1 (left-padded prompt)
    assert b["input_ids"][0].tolist() == [1, 5, 6, 14, 7, 16, 5, 9, 2]
    assert b["input_ids"][3].tolist() == [0, 1, 5, 14, 5, 16, 5, 5, 2]
    assert TOK.decode(b["input_ids"][2].tolist()) == "12+3=16"
    assert b["chosen_lengths"].tolist() == [3, 2] and b["rejected_lengths"].tolist() == [3, 3]
    assert b["completion_mask"].sum(-1).tolist() == [3, 2, 3, 3]
    assert b["attention_mask"].sum(-1).tolist() == [9, 7, 9, 8]
    assert b["margin"].tolist() == [0.5, 1.0]
    # the last real token of every row is the EOS (where a reward model reads)
    from posttrain.models.heads import last_token_index

    ids = b["input_ids"]
    assert ids[torch.arange(4), last_token_index(b["attention_mask"])].tolist() == [TOK.eos_id] * 4


def test_collate_truncation_and_no_margin():
    pairs = [PreferencePair("123456789=", "1234", "9")]
    b = collate_preference(pairs, TOK, max_prompt_length=4, max_completion_length=2)
    assert b["completion_start"] == 4
    ids = b["input_ids"][0, :4].tolist()  # BOS and the end of the prompt are kept (as in evaluation and RL)
    assert (
        (ids[0] == TOK.bos_id and TOK.decode(ids[1:]) == "89=") if TOK.bos_id is not None else TOK.decode(ids) == "789="
    )
    assert TOK.decode(b["input_ids"][0, 4:].tolist()) == "12"  # the start of the completion is kept
    assert "margin" not in b
    with pytest.raises(DataError, match="empty"):
        collate_preference([PreferencePair("1", "", "2")], TOK, add_eos=False)


def test_collate_kto_with_mismatched_kl_batch():
    ex = [KTOExample("1+1=", "2", True), KTOExample("2+2=", "45", False), KTOExample("3+3=", "6", True)]
    b = collate_kto(ex, TOK)
    assert b["labels"].tolist() == [True, False, True]
    P = b["kl_completion_start"]
    # prompt i is paired with completion i+1 (mod 3)
    assert TOK.decode(b["kl_input_ids"][0].tolist()) == "1+1=45"
    assert TOK.decode(b["kl_input_ids"][2].tolist()) == "3+3=2"
    assert b["kl_completion_mask"].sum(-1).tolist() == [3, 2, 2] and P == 5


# ---------------------------------------------------------------------------------------------
# log-probs over the layout equal log-probs of each sequence alone (the oracle)


def test_sequence_logps_over_the_batch_match_unpadded_per_sequence_forward():
    transformers = pytest.importorskip("transformers")
    from posttrain.losses.logprobs import sequence_logps
    from posttrain.scoring import completion_logps

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=TOK.vocab_size, n_positions=32)
    ).eval()
    pairs = [PreferencePair("12+3=", "15", "106"), PreferencePair("1+1=", "2", "11"), PreferencePair("9-9=", "0", "9")]
    b = collate_preference(pairs, TOK)
    with torch.no_grad():
        lp = completion_logps(
            model, b["input_ids"], b["attention_mask"], b["completion_start"], completion_mask=b["completion_mask"]
        )
        seq = sequence_logps(lp, b["completion_mask"])  # (2B,)
        expected = []
        for resp_of in ("chosen", "rejected"):
            for p in pairs:
                prompt = [TOK.bos_id] + TOK.encode(p.prompt)
                comp = TOK.encode(getattr(p, resp_of)) + [TOK.eos_id]
                ids = torch.tensor([prompt + comp])
                logits = model(input_ids=ids).logits[0].log_softmax(-1)  # (T, V)
                expected.append(sum(logits[len(prompt) - 1 + j, tok].item() for j, tok in enumerate(comp)))
    torch.testing.assert_close(seq, torch.tensor(expected), atol=1e-5, rtol=1e-5)
