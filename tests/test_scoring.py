"""posttrain.scoring: model-running log-probs (the tensor maths is tested in tests/losses/test_logprobs.py)."""

import torch


def test_prefix_shared_logps_equal_full_forward_with_gradients():
    """Sharing each prompt's keys/values across its samples gives the same log-probs, entropies and gradients."""
    from posttrain.generate import SamplingConfig, generate
    from posttrain.models.gpt import GPT, GPTConfig
    from posttrain.scoring import completion_logps, prefix_shared_completion_logps

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=17, n_layer=2, n_head=2, d_model=32, max_seq_len=32))
    prompts = [[1, 5, 6, 14, 7, 8, 16], [1, 9, 16], [1, 5, 5, 5]]
    for T, kw in [(1.0, {}), (0.7, {"top_k": 6, "top_p": 0.9})]:
        g = generate(
            m,
            prompts,
            pad_id=0,
            eos_id=2,
            cfg=SamplingConfig(max_new_tokens=6, temperature=T, num_samples=4, **kw),
            generator=torch.Generator().manual_seed(0),
        )
        rows = torch.tensor([5, 0, 11, 3, 4, 9, 1])  # shuffled subset: groups split and reordered
        args = (g.sequences[rows], g.attention_mask[rows], g.prompt_length)
        opts = dict(temperature=T, completion_mask=g.completion_mask[rows], **kw)
        m.zero_grad()
        lp_a, ent_a = completion_logps(m, *args, return_entropy=True, **opts)
        (lp_a.sum() + ent_a.sum()).backward()
        grads_a = [p.grad.clone() for p in m.parameters()]
        m.zero_grad()
        lp_b, ent_b = prefix_shared_completion_logps(m, *args, g.prompt_index[rows], **opts)
        (lp_b.sum() + ent_b.sum()).backward()
        torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
        for a, b in zip(grads_a, [p.grad for p in m.parameters()]):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)


def test_prefix_shared_logps_of_one_token_completions():
    """A micro-batch whose longest completion is one token: only the prompts run (no completion position), and the
    log-probs are the full forward's."""
    from posttrain.models.gpt import GPT, GPTConfig
    from posttrain.scoring import completion_logps, prefix_shared_completion_logps

    torch.manual_seed(1)
    m = GPT(GPTConfig(vocab_size=17, n_layer=2, n_head=2, d_model=32, max_seq_len=32))
    seqs = torch.tensor([[0, 1, 5, 6, 3], [0, 1, 5, 6, 9], [1, 9, 16, 4, 2]])  # P = 4, one completion token each
    mask = torch.tensor([[0, 1, 1, 1, 1], [0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    lp_a, ent_a = completion_logps(m, seqs, mask, 4, return_entropy=True)
    lp_b, ent_b = prefix_shared_completion_logps(m, seqs, mask, 4, torch.tensor([0, 0, 1]))
    assert lp_b.shape == (3, 1)
    torch.testing.assert_close(lp_b, lp_a, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent_b, ent_a, atol=1e-5, rtol=1e-5)
