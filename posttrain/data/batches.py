"""Which examples a training step sees: a pure function of (n, batch size, step, seed).

Step ``s``'s batch is positions ``[s*B, (s+1)*B)`` of the concatenation of epoch permutations, epoch ``e``'s
permutation seeded by ``stream_seed(seed, e) = seed * 1_000_003 + e``. Nothing is carried between steps, so a run resumed at step
k draws the batches an uninterrupted run draws (the bitwise resume tests rely on it), and every trainer
(SFT, RM, DPO, the policy-gradient prompt batches) uses this one function.

Not handled: weighted or stratified sampling, sharding across processes.
"""

from __future__ import annotations

import torch


def stream_seed(seed: int, index: int) -> int:
    """The seed of stream ``index`` (an epoch, a step) of run seed ``seed``: ``seed * 1_000_003 + index``, the one
    mixer every trainer uses (batch order here, the policy-gradient sampling and minibatch generators)."""
    return seed * 1_000_003 + index


def batch_indices(n: int, batch_size: int, step: int, seed: int) -> torch.Tensor:
    """Indices of step ``step``'s batch: positions [step*B, (step+1)*B) of the concatenated epoch permutations."""
    out, start = [], step * batch_size
    while len(out) < batch_size:
        epoch, offset = divmod(start + len(out), n)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(stream_seed(seed, epoch)))
        take = min(batch_size - len(out), n - offset)
        out.extend(perm[offset : offset + take].tolist())
    return torch.tensor(out)
