"""Digit-slot positions. Oracles: the row-at-a-time reference formula, the place-value property (units digits and
``=`` at the same slot in every layout), GPT-2's own positions for the ``2+2`` layout, and generation and scoring
paths that must agree (cache vs full forward, prefix-shared vs full)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.errors import ConfigError, UserError
from posttrain.generate import SamplingConfig, generate
from posttrain.models.digit_slots import (
    BOS,
    EQ,
    check_tokenizer,
    model_positions,
    slot_positions,
    slot_positions_reference,
)
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.models.heads import positions_from_mask
from posttrain.scoring import completion_logps, prefix_shared_completion_logps
from posttrain.tasks.arithmetic import ALPHABET
from posttrain.tokenizers.char import CharTokenizer

TOK = CharTokenizer(ALPHABET)


def row(text: str, pad: int = 0) -> list[int]:
    return [TOK.pad_id] * pad + [BOS] + TOK.encode(text)


def vectorised(ids: list[int], fallback: list[int], digits: int) -> list[int]:
    return slot_positions(torch.tensor([ids]), torch.tensor([fallback]), digits)[0].tolist()


@settings(max_examples=200, deadline=None)
@given(
    digits=st.integers(1, 4),
    data=st.data(),
    op=st.sampled_from("+-"),
    answer=st.text(alphabet="0123456789-", max_size=5),
    pad=st.integers(0, 3),
)
def test_units_digits_and_equals_sit_at_fixed_slots(digits, data, op, answer, pad):
    a = data.draw(st.integers(0, 10**digits - 1))
    b = data.draw(st.integers(0, 10**digits - 1))
    ids = row(f"{a}{op}{b}={answer}", pad)
    fallback = [0] * pad + list(range(len(ids) - pad))
    pos = vectorised(ids, fallback, digits)
    assert pos == slot_positions_reference(ids, fallback, digits)
    o = pad + 1 + len(str(a))
    e = o + 1 + len(str(b))
    assert pos[: pad + 1] == [0] * (pad + 1)  # padding and BOS
    assert pos[o - 1] == digits and pos[o] == digits + 1 and pos[e - 1] == 2 * digits + 1 and pos[e] == 2 * digits + 2
    assert pos[e + 1 :] == list(range(2 * digits + 3, 2 * digits + 3 + len(answer)))
    # within a number each digit sits one slot left of the next: place values, counted from the units
    for lo, hi in ((pad + 1, o), (o + 1, e), (e, len(ids))):
        assert all(pos[i + 1] - pos[i] == 1 for i in range(lo, hi - 1))
    if len(str(a)) == len(str(b)) == digits:  # the full layout: GPT-2's own positions
        assert pos[pad:] == list(range(len(ids) - pad))


@settings(max_examples=300, deadline=None)
@given(
    rows=st.lists(st.lists(st.integers(0, TOK.vocab_size - 1), min_size=1, max_size=12), min_size=1, max_size=6),
    digits=st.integers(1, 3),
)
def test_vectorised_equals_reference_on_any_tokens(rows, digits):
    """Random rows, most not a problem at all (which keep the fallback), batched with right padding."""
    T = max(map(len, rows))
    ids = [r + [TOK.pad_id] * (T - len(r)) for r in rows]
    fallback = [[10 + i] * T for i in range(len(ids))]  # recognisable
    got = slot_positions(torch.tensor(ids), torch.tensor(fallback), digits).tolist()
    assert got == [slot_positions_reference(r, f, digits) for r, f in zip(ids, fallback)]


def test_rows_that_are_not_problems_keep_their_positions():
    for text in ("123+4=5", "1+2+3=", "12=", "+12=", "1a", "12+=", "7+8"):
        ids = [BOS] + TOK.encode(text)
        fb = list(range(len(ids)))
        assert vectorised(ids, fb, 2) == fb, text
    assert vectorised(TOK.encode("12+3="), [0, 1, 2, 3, 4], 2) == [0, 1, 2, 3, 4]  # no BOS


def slots_gpt(digits: int = 2) -> GPT:
    torch.manual_seed(0)
    return GPT(
        GPTConfig(vocab_size=TOK.vocab_size, n_layer=2, n_head=2, d_model=32, max_seq_len=24, digit_slots=digits)
    )


PROMPTS = [row("3+45="), row("13+5="), row("7+8="), row("13+45="), row("99-1=")]


def test_generation_with_cache_equals_full_forwards_at_the_slots():
    """The cached decode (positions from the prompt's slots) agrees with the no-cache path and with a greedy loop of
    full forwards (where the model computes the slots itself)."""
    m = slots_gpt()
    cfg = SamplingConfig(max_new_tokens=5, temperature=0)
    a = generate(m, PROMPTS, pad_id=TOK.pad_id, eos_id=None, cfg=cfg)
    b = generate(m, PROMPTS, pad_id=TOK.pad_id, eos_id=None, cfg=cfg, use_cache=False)
    assert torch.equal(a.sequences, b.sequences)
    torch.testing.assert_close(a.logps, b.logps, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        for i, p in enumerate(PROMPTS):
            ids = list(p)
            for _ in range(5):
                ids.append(int(m(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
            assert a.completion_ids[i].tolist() == ids[len(p) :], i


def test_the_slots_change_what_the_model_computes_only_off_the_full_layout():
    m = slots_gpt()
    plain = GPT(GPTConfig(**{**m.config.__dict__, "digit_slots": 0}))
    plain.load_state_dict(m.state_dict())
    with torch.no_grad():
        for text, same in (("13+45=58", True), ("3+45=48", False), ("13+5=18", False)):
            ids = torch.tensor([row(text)])
            equal = torch.equal(m(input_ids=ids).logits, plain(input_ids=ids).logits)
            assert equal == same, text


def test_scoring_paths_agree():
    m = slots_gpt()
    cfg = SamplingConfig(max_new_tokens=4, temperature=1.0, num_samples=3)
    g = generate(m, PROMPTS, pad_id=TOK.pad_id, eos_id=TOK.eos_id, cfg=cfg, generator=torch.Generator().manual_seed(1))
    kw = dict(completion_mask=g.completion_mask)
    full = completion_logps(m, g.sequences, g.attention_mask, g.prompt_length, **kw)
    shared, _ = prefix_shared_completion_logps(m, g.sequences, g.attention_mask, g.prompt_length, g.prompt_index, **kw)
    torch.testing.assert_close(full, g.logps, atol=1e-5, rtol=1e-5)  # the sampler's log-probs, recomputed
    torch.testing.assert_close(shared, full, atol=1e-5, rtol=1e-5)
    pos = model_positions(m, g.sequences, positions_from_mask(g.attention_mask))
    assert pos[0, g.prompt_length - 1] == 6 and pos[1, g.prompt_length - 1] == 6  # '=' of "3+45=" and "13+5="
    assert (g.sequences[:, g.prompt_length - 1] == EQ).all()


def test_export_and_a_foreign_tokenizer_are_refused():
    pytest.importorskip("transformers")
    from posttrain.models.convert import gpt_to_hf_gpt2

    with pytest.raises(UserError, match="digit_slots"):
        gpt_to_hf_gpt2(slots_gpt())
    check_tokenizer(TOK, 2, 2)
    check_tokenizer(object(), 0, 2)  # off: nothing to check
    with pytest.raises(ConfigError, match="character tokenizer"):
        check_tokenizer(CharTokenizer("0123456789+="), 2, 2)
    with pytest.raises(ConfigError, match="task.digits"):
        check_tokenizer(TOK, 2, 3)
