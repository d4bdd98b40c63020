"""The LM with each attention backend: same logits, and a short training run with "flash" follows "sdpa"."""

import pytest
import torch

from posttrain.models.gpt import GPT, GPTConfig


def tiny(backend: str) -> GPT:
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=23, n_layer=2, n_head=4, n_kv_head=2, d_model=32, max_seq_len=24, attn_backend=backend)
    return GPT(cfg)


def batch(seed=1, b=4, t=20):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 23, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, :5] = 0  # left padding
    mask[2, -3:] = 0  # right padding
    return ids, mask


@pytest.mark.parametrize("backend", ["naive", "flash"])
def test_logits_match_sdpa(backend):
    ids, mask = batch()
    ref, model = tiny("sdpa"), tiny(backend)
    model.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for attention_mask in (None, mask):
            want = ref(ids, attention_mask=attention_mask).logits
            got = model(ids, attention_mask=attention_mask).logits
            real = (attention_mask if attention_mask is not None else torch.ones_like(ids)).bool()
            torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=1e-5)


def test_decode_with_cache_matches_sdpa():
    ids, _ = batch(seed=2, b=3, t=12)
    ref, model = tiny("sdpa"), tiny("flash")
    model.load_state_dict(ref.state_dict())
    with torch.no_grad():
        outs = []
        for m in (ref, model):
            cache = m.make_cache(3, 24)
            first = m(ids[:, :8], cache=cache, use_cache=True).logits  # prefill
            steps = [m(ids[:, i : i + 1], cache=cache, use_cache=True).logits for i in range(8, 12)]  # Nq = 1
            outs.append(torch.cat([first, *steps], dim=1))
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)


def train_losses(backend: str, steps: int = 20) -> list[float]:
    model = tiny(backend)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids, mask = batch(seed=3, b=8, t=16)
    losses = []
    for _ in range(steps):
        logits = model(ids[:, :-1], attention_mask=mask[:, :-1]).logits  # (B, T-1, V)
        target_mask = mask[:, 1:].bool()
        loss = torch.nn.functional.cross_entropy(logits[target_mask], ids[:, 1:][target_mask])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_flash_training_follows_sdpa_loss_curve():
    sdpa, flash = train_losses("sdpa"), train_losses("flash")
    assert sdpa[-1] < sdpa[0] - 0.5  # it actually learns (memorises the batch)
    for step, (a, b) in enumerate(zip(sdpa, flash)):
        assert abs(a - b) < 1e-4 * max(1.0, abs(a)), (step, a, b)
