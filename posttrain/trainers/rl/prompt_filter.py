"""Pre-rollout prompt filtering (GRESO, Zheng et al. 2025): skip a prompt that taught nothing last time, before
paying for its G samples.

Key insight: a prompt whose G rewards were all equal (zero advantage, no gradient) is likely to be so again the
next time it is drawn, and dynamic sampling pays a whole rollout to find that out. Keep for each prompt the
count z of its consecutive zero-variance rollouts and sample it with probability

    P(sample) = p ** z        (z = 0: always; each uninformative rollout in a row multiplies the chance by p)

A skipped prompt keeps its count and comes back in a later pass over the data, where p ** z gives it a chance to
show it has become informative again (the paper's exploration). One informative rollout resets z to 0.

Here the filter acts on dynamic sampling's refill rounds only: round 0 stays the classic, unfiltered batch, an
unbiased measure of the policy for the metrics, the alarms and the collapse guard. A filtered round takes its
prompts from a pool ``pool`` times the round's size (the next positions of its own prompt stream): the first
``want`` that pass, then, if too few pass, the skipped ones in stream order, so a round always has ``want`` prompts;
with ``prompt_filter_fill`` off a round is only the prompts that passed (fewer samples when most prompts are solved).

Here: :func:`sample_mask` (which candidates pass), :func:`select` (a round's prompts from its pool) and
:class:`PromptHistory` (the counts z, updated after every round and saved in checkpoints for an exact resume).
"""

from __future__ import annotations

import torch

from posttrain.errors import UserError


def sample_mask(streak: torch.Tensor, p: float, generator: torch.Generator) -> torch.Tensor:
    """(K,) counts z -> (K,) bool: True where the candidate is sampled, with probability p ** z."""
    u = torch.rand(streak.shape, generator=generator, dtype=torch.float64)
    return u < torch.pow(torch.full(streak.shape, p, dtype=torch.float64), streak.to(torch.float64))


def select(
    pool: torch.Tensor, streak: torch.Tensor, p: float, want: int, generator: torch.Generator, fill: bool = True
):
    """A round's prompts from its candidate pool (prompt indices, stream order).

    Returns (chosen indices, the fraction of the pool that passed). The chosen are the first ``want`` candidates
    that pass :func:`sample_mask`; if fewer pass, the round is filled with the first skipped ones (``fill``), or
    is that smaller round (``fill=False``: no samples paid for prompts the filter skipped; possibly none).
    """
    if len(pool) < want:
        raise ValueError(f"a pool of {len(pool)} candidates cannot give {want} prompts")
    ok = sample_mask(streak[pool], p, generator)
    passed, skipped = pool[ok], pool[~ok]
    chosen = torch.cat([passed[:want], skipped[: max(0, want - len(passed)) if fill else 0]])
    return chosen, ok.double().mean().item()


class PromptHistory:
    """Per prompt, the number z of its most recent rollouts in a row whose rewards were all equal."""

    def __init__(self, num_prompts: int):
        self.streak = torch.zeros(num_prompts, dtype=torch.int64)
        self.pass_rates: list[float] = []  # of the refill rounds since the rollout's metrics last took them

    def update(self, prompts: torch.Tensor, zero_variance: torch.Tensor) -> None:
        """Record one rollout of each of ``prompts``: z + 1 where ``zero_variance``, else 0 (a prompt drawn twice in one
        round counts once)."""
        self.streak[prompts] = torch.where(zero_variance, self.streak[prompts] + 1, torch.zeros_like(prompts))

    def state_dict(self) -> dict:
        nz = self.streak.nonzero().flatten()
        return {"num_prompts": len(self.streak), "index": nz.tolist(), "streak": self.streak[nz].tolist()}

    def load_state_dict(self, state: dict) -> None:
        if int(state["num_prompts"]) != len(self.streak):
            raise UserError(
                f"the checkpoint's prompt history has {state['num_prompts']} prompts, the data {len(self.streak)}: "
                "resume with the prompts the run started with"
            )
        self.streak.zero_()
        self.streak[torch.tensor(state["index"], dtype=torch.int64)] = torch.tensor(state["streak"], dtype=torch.int64)
