"""Value models: V(s_t) read where the policy reads y_t, masking, padding invariance, RM and policy init, shared head."""

import torch

from posttrain.models.gpt import GPT, GPTConfig
from posttrain.models.heads import RewardModel
from posttrain.models.value import ValueHead, ValueModel, completion_values, shared_forward


def _gpt(seed=0):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=17, n_layer=1, n_head=2, d_model=16, max_seq_len=32))


def _batch():
    # [left-padded prompt (P=3) | completion (T=3)]; row 1 ends after 1 completion token (EOS), then pads
    ids = torch.tensor([[0, 5, 6, 7, 8, 9], [3, 4, 5, 6, 0, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    return ids, mask, 3, mask[:, 3:]


def test_completion_values_indexing_and_masking():
    v = torch.arange(12.0).view(2, 6)
    out = completion_values(v, 3, torch.tensor([[1, 1, 1], [1, 0, 0]]))
    assert torch.equal(out, torch.tensor([[2.0, 3.0, 4.0], [8.0, 0.0, 0.0]]))


def test_value_of_each_prefix_is_the_reward_models_score_of_that_prefix():
    """Oracle: with the head copied from an RM, V(s_t) = RM(prompt + y_<t), the RM reading the last real token."""
    rm = RewardModel(_gpt())
    torch.nn.init.normal_(rm.head.proj.weight)
    torch.nn.init.normal_(rm.head.proj.bias)
    critic = ValueModel.from_reward_model(rm)
    ids, mask, P, cmask = _batch()
    with torch.no_grad():
        v = critic(ids, mask, P, cmask)
        for t in range(3):
            expect = rm(ids[:, : P + t], mask[:, : P + t])
            for b in range(2):
                if cmask[b, t]:
                    torch.testing.assert_close(v[b, t], expect[b], atol=1e-5, rtol=1e-5)
                else:
                    assert v[b, t].item() == 0.0  # after EOS: exactly 0
    assert critic.backbone.model is not rm.backbone.model  # a copy: training the critic leaves the RM alone


def test_extra_left_padding_changes_no_value():
    critic = ValueModel(_gpt())
    torch.nn.init.normal_(critic.head.proj.weight)
    ids, mask, P, cmask = _batch()
    pad_ids = torch.cat([torch.zeros(2, 2, dtype=ids.dtype), ids], 1)
    pad_mask = torch.cat([torch.zeros(2, 2, dtype=mask.dtype), mask], 1)
    with torch.no_grad():
        torch.testing.assert_close(
            critic(ids, mask, P, cmask), critic(pad_ids, pad_mask, P + 2, cmask), atol=1e-5, rtol=1e-5
        )


def test_from_policy_starts_at_zero_and_owns_its_weights():
    policy = _gpt()
    critic = ValueModel.from_policy(policy)
    ids, mask, P, cmask = _batch()
    assert torch.equal(critic(ids, mask, P, cmask), torch.zeros(2, 3))
    loss = critic(ids, mask, P, cmask).sum() + critic.head.proj.weight.sum()
    loss.backward()
    assert all(p.grad is None for p in policy.parameters())


def test_shared_head_reads_the_policys_own_hidden_states():
    policy = _gpt()
    head = ValueHead(16)
    torch.nn.init.normal_(head.proj.weight)
    ids, mask, P, _ = _batch()
    pos = (mask.cumsum(-1) - 1).clamp_min(0)
    logits, values = shared_forward(policy, head, ids, mask, pos)
    out = policy(input_ids=ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
    torch.testing.assert_close(logits, out.logits)
    torch.testing.assert_close(values, head(out.hidden_states))
