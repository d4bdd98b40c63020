"""trainers/reward_batches.py: prompt-grouped RM batches score each distinct completion once and give the pair
batches' rewards, loss and gradients on the same pairs; the trainer learns and resumes with them."""

import json
import shutil

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posttrain.data.preference import PreferencePair, collate_preference
from posttrain.losses.ranking import bradley_terry_loss
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.models.heads import RewardModel
from posttrain.rewards.reward_model import load_reward_model
from posttrain.tasks.arithmetic import ArithmeticConfig
from posttrain.tokenizers.char import CharTokenizer
from posttrain.trainers.reward import RMConfig, train_reward_model
from posttrain.trainers.reward_batches import (
    batch_rewards,
    collate_prompt_groups,
    prompt_groups,
    row_rewards,
    shares_prompt,
)

TOK = CharTokenizer("0123456789+-=")
PAIRS = [
    PreferencePair("7+8=", "15", "14"),
    PreferencePair("12+9=", "21", "2111"),  # a longer prompt (left padding), a longer completion (right padding)
    PreferencePair("7+8=", "15", "16"),  # the first prompt again: its "15" row is shared
    PreferencePair("3+4=", "7", "70", margin=2.0),
    PreferencePair("7+8=", "16", "1"),  # "16" is rejected above and chosen here: one row, both roles
]


def _rm(seed=0):
    torch.manual_seed(seed)
    return RewardModel(GPT(GPTConfig(vocab_size=TOK.vocab_size, n_layer=2, n_head=2, d_model=32, max_seq_len=24)))


def test_prompt_groups_first_seen_order():
    assert prompt_groups(PAIRS) == [[0, 2, 4], [1], [3]]


def test_rows_are_distinct_and_point_at_each_pairs_texts():
    groups = prompt_groups(PAIRS)
    b = collate_prompt_groups(PAIRS, groups, TOK)
    ids, cmask, P = b["input_ids"], b["completion_mask"], b["completion_start"]
    texts = [TOK.decode([t for t, k in zip(ids[r, P:].tolist(), cmask[r].tolist()) if k]) for r in range(len(ids))]
    order = [i for g in groups for i in g]
    assert len(texts) == 8  # "7+8=": 15 14 16 1 (3 pairs, 6 completions, 4 distinct) | 21 2111 | 7 70
    assert len(set(zip(b["prompt_index"].tolist(), texts))) == len(texts)
    for k, i in enumerate(order):
        c, r = b["chosen_rows"][k], b["rejected_rows"][k]
        assert texts[c] == PAIRS[i].chosen and texts[r] == PAIRS[i].rejected
        assert b["prompt_index"][c] == b["prompt_index"][r] == groups.index(next(g for g in groups if i in g))


def test_grouped_rewards_loss_and_gradients_equal_the_pair_batch():
    """The oracle is the plain pair batch: 2 full rows per pair, rm(input_ids, mask)."""
    rm = _rm()
    assert shares_prompt(rm)
    groups = prompt_groups(PAIRS)
    order = [i for g in groups for i in g]
    pb = collate_preference([PAIRS[i] for i in order], TOK)
    rm.zero_grad()
    c_ref, r_ref = rm(pb["input_ids"], pb["attention_mask"]).chunk(2)
    loss_ref, _ = bradley_terry_loss(c_ref, r_ref)
    loss_ref.backward()
    grads = [p.grad.clone() for p in rm.parameters()]
    gb = collate_prompt_groups(PAIRS, groups, TOK)
    for share in (False, True):
        rm.zero_grad()
        r = row_rewards(rm, gb, share_prompt=share)
        c, x = r[gb["chosen_rows"]], r[gb["rejected_rows"]]
        torch.testing.assert_close(c, c_ref.detach(), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(x, r_ref.detach(), atol=1e-5, rtol=1e-5)
        loss, _ = bradley_terry_loss(c, x)
        loss.backward()
        torch.testing.assert_close(loss, loss_ref.detach(), atol=1e-6, rtol=1e-5)
        for a, g in zip(grads, [p.grad for p in rm.parameters()]):
            torch.testing.assert_close(g, a, atol=1e-5, rtol=1e-4)


def test_shared_prompt_pair_batch_equals_the_full_forward_with_gradients():
    rm = _rm(1)
    batch = collate_preference(PAIRS, TOK)
    w = torch.arange(1.0, 2 * len(PAIRS) + 1)  # distinct weights: a swapped row would show in the gradients
    rm.zero_grad()
    full = rm(batch["input_ids"], batch["attention_mask"])
    (full * w).sum().backward()
    grads = [p.grad.clone() for p in rm.parameters()]
    rm.zero_grad()
    shared = batch_rewards(rm, batch, share_prompt=True)
    (shared * w).sum().backward()
    torch.testing.assert_close(shared, full.detach(), atol=1e-5, rtol=1e-5)
    for a, g in zip(grads, [p.grad for p in rm.parameters()]):
        torch.testing.assert_close(g, a, atol=1e-5, rtol=1e-4)
    assert torch.equal(batch_rewards(rm, batch, share_prompt=False), rm(batch["input_ids"], batch["attention_mask"]))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["1+1=", "2+3=", "10+5="]), st.text("0123456789", min_size=1, max_size=3)),
        min_size=2,
        max_size=12,
    )
)
def test_any_pairs_keep_their_texts(items):
    """Property: for any pairs (repeated prompts and completions included) every pair's rows hold its texts."""
    pairs = [PreferencePair(p, c, c + "9") for p, c in items]
    groups = prompt_groups(pairs)
    b = collate_prompt_groups(pairs, groups, TOK)
    ids, cmask, P = b["input_ids"], b["completion_mask"], b["completion_start"]
    text = lambda r: TOK.decode([t for t, k in zip(ids[r, P:].tolist(), cmask[r].tolist()) if k])  # noqa: E731
    order = [i for g in groups for i in g]
    assert [text(r) for r in b["chosen_rows"].tolist()] == [pairs[i].chosen for i in order]
    assert [text(r) for r in b["rejected_rows"].tolist()] == [pairs[i].rejected for i in order]
    assert len(ids) == len({(pairs[i].prompt, t) for i in order for t in (pairs[i].chosen, pairs[i].rejected)})


TASK = ArithmeticConfig(digits=1, num_demos=20, num_eval=8)


def _cfg(out, **kw):
    base = dict(
        out=str(out),
        steps=4,
        batch_size=4,
        batch_by="prompt",
        eval_every=0,
        save_every=0,
        warmup_steps=1,
        progress=False,
        eval_prompts=8,
        stats_pairs=16,
        model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24),
        task=TASK,
    )
    base.update(kw)
    return RMConfig(**base)


def test_prompt_batches_learn_a_separable_preference(tmp_path):
    # chosen answers end in "1", rejected in "2", several pairs per prompt
    lines = [
        json.dumps({"prompt": f"{a}+1=", "chosen": f"{a}{b}1", "rejected": f"{b}2"})
        for a in range(10)
        for b in range(3)
    ]
    data, held = tmp_path / "p.jsonl", tmp_path / "h.jsonl"
    data.write_text("\n".join(lines[:24]) + "\n")
    held.write_text("\n".join(lines[24:]) + "\n")
    s = train_reward_model(_cfg(tmp_path / "o", data=str(data), eval_data=str(held), steps=25, lr=1e-2))
    assert s["heldout_pairwise_accuracy"] == 1.0


def test_prompt_batches_resume_bitwise(tmp_path):
    train_reward_model(_cfg(tmp_path / "full"))
    train_reward_model(_cfg(tmp_path / "part", save_every=2))
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "part" / "checkpoints" / "step-00000002", resumed / "checkpoints" / "step-00000002")
    (resumed / "checkpoints" / "latest").write_text("step-00000002\n")
    for f in ("pairs.jsonl", "pairs.meta.json", "eval_pairs.jsonl", "eval_pairs.meta.json"):
        shutil.copy(tmp_path / "part" / f, resumed / f)
    train_reward_model(_cfg(resumed), resume=str(resumed))
    a, b = load_reward_model(tmp_path / "full").model.state_dict(), load_reward_model(resumed).model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_chosen_nll_is_the_full_forward_nll_of_the_chosen_completions():
    """The GRM term read off the RM's own shared-prompt forward equals the chosen completions' mean token NLL from
    an independent full forward of the backbone LM (``scoring.completion_logps``), and its gradient too."""
    from posttrain.scoring import completion_logps

    rm = _rm(2)
    batch = collate_preference(PAIRS, TOK)
    B = len(PAIRS)
    chosen = torch.arange(B)
    rm.zero_grad()
    lp = completion_logps(
        rm.backbone.model,
        batch["input_ids"][:B],
        batch["attention_mask"][:B],
        batch["completion_start"],
        completion_mask=batch["completion_mask"][:B],
    )
    want = -lp.sum() / batch["completion_mask"][:B].sum()
    want.backward()
    grads = [p.grad.clone() if p.grad is not None else None for p in rm.backbone.parameters()]
    rm.zero_grad()
    r, nll = batch_rewards(rm, batch, share_prompt=True, lm_rows=chosen)
    assert r.shape == (2 * B,)
    torch.testing.assert_close(nll, want.detach(), atol=1e-5, rtol=1e-5)
    nll.backward()
    for a, p in zip(grads, rm.backbone.parameters()):
        if a is not None:
            torch.testing.assert_close(p.grad, a, atol=1e-5, rtol=1e-4)


def test_sft_coef_trains_the_backbone_lm_on_chosen_answers(tmp_path):
    """With sft_coef the chosen answers' NLL under the backbone falls during RM training (logged as chosen_nll);
    without it nothing is logged and the loss is the plain BT loss."""
    lines = [json.dumps({"prompt": f"{a}+1=", "chosen": f"{a}1", "rejected": f"{a}2"}) for a in range(10)]
    data, held = tmp_path / "p.jsonl", tmp_path / "h.jsonl"
    data.write_text("\n".join(lines[:8]) + "\n")
    held.write_text("\n".join(lines[8:]) + "\n")
    kw = dict(data=str(data), eval_data=str(held), steps=30, lr=1e-2, batch_by="pair", batch_size=8)
    train_reward_model(_cfg(tmp_path / "grm", sft_coef=1.0, **kw))
    rows = [json.loads(x) for x in (tmp_path / "grm" / "metrics.jsonl").read_text().splitlines()]
    nll = [r["chosen_nll"] for r in rows if "chosen_nll" in r]
    assert len(nll) == 30 and nll[-1] < 0.5 * nll[0]
    train_reward_model(_cfg(tmp_path / "bt", **kw))
    rows = [json.loads(x) for x in (tmp_path / "bt" / "metrics.jsonl").read_text().splitlines()]
    assert not any("chosen_nll" in r for r in rows)
