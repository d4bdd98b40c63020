"""SFT demonstrations as token ids: ``[BOS] prompt answer [EOS]``, right-padded, with the loss on answer + EOS.

    ids  (n, L)  BOS prompt answer EOS PAD ...
    mask (n, L)  0   0      1      1   0   ...     (1 = a token the SFT loss predicts)

``fit_demos`` checks every demonstration first (unknown characters, the model's window; ``long`` = error |
truncate | skip, with file:line errors from ``data/checks.py``) and sends conversations through the chat
template's assistant mask (``data/conversations.py``). Prompts are encoded by ``data/encode.py``, as in every
other trainer, so a prompt is the same token sequence in SFT, RL, DPO and evaluation.
"""

from __future__ import annotations

import torch

from posttrain.data.checks import Located, fit_sequences, model_window
from posttrain.data.conversations import fit_chat_demos, needs_chat
from posttrain.data.encode import encode_prompt


def encode_demos(tokenizer, pairs: list[tuple[str, str]], fitted=None) -> tuple[torch.Tensor, torch.Tensor]:
    """[BOS] prompt answer [EOS], right-padded; loss mask on answer + EOS. -> ids (n, L), mask (n, L).
    ``fitted``: the pairs' token ids as checked by ``fit_sequences`` (then ``pairs`` is not re-encoded)."""
    if fitted is None:
        encoded = [(encode_prompt(tokenizer, p), tokenizer.encode(a) + [tokenizer.eos_id]) for p, a in pairs]
    else:
        encoded = [(f.prompt, f.completions[0]) for f in fitted]
    seqs, masks = [], []
    for pi, ai in encoded:
        seqs.append(pi + ai)
        masks.append([0] * len(pi) + [1] * len(ai))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (s, m) in enumerate(zip(seqs, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(m)] = torch.tensor(m)
    return ids, mask


def fit_demos(tokenizer, demos, model, long: str, chat=None):
    """Check demonstrations (unknown characters, the model's window) -> (kept demos, ids, loss mask).
    Conversations (and, with a template for everything, pairs) go through the chat template's mask."""
    if needs_chat(demos, chat):
        return fit_chat_demos(tokenizer, demos, chat, window=model_window(model), long=long)
    kept, fitted = fit_sequences(
        tokenizer, demos, lambda r: (r[0], [("answer", r[1])]), window=model_window(model), long=long, what="training"
    )
    demos = demos.subset(kept) if isinstance(demos, Located) else [demos[i] for i in kept]
    return (demos, *encode_demos(tokenizer, demos, fitted))
