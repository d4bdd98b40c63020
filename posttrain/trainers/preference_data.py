"""What a DPO-family loss is fed: the per-sequence log-probs of a collated batch (``seq_logps``), the extra tensors
a loss declares (``EXTRA_INPUTS``), and the training examples as paired or unpaired data (``PairedData``,
``UnpairedData``: the same interface, chosen by the loss; encoding, batches, precomputed reference log-probs and the
loss's inputs), read from the user's file by ``load_user_data``.

Not handled here: the loss itself (``losses/preference/``), the trainer's loop (``dpo.py``).
"""

from __future__ import annotations

import torch

from posttrain.data.io import iter_records
from posttrain.data.preference import (
    collate_kto,
    collate_preference,
    load_kto_examples,
    load_preference_pairs,
    pairs_to_kto,
)
from posttrain.errors import UserError
from posttrain.losses.logprobs import sequence_logps
from posttrain.losses.preference import resolve_loss
from posttrain.scoring import completion_logps
from posttrain.trainers.dpo_config import DPOConfig
from posttrain.trainers.engine import device

# ---------------------------------------------------------------------------------------------
# what a loss needs, by declaration

EXTRA_INPUTS = {
    "chosen_lengths": lambda batch, token_lp, B: batch["chosen_lengths"],
    "rejected_lengths": lambda batch, token_lp, B: batch["rejected_lengths"],
    # RPO's NLL as Pang et al. define it: the chosen completion's length-normalised negative log-likelihood
    "chosen_nll": lambda batch, token_lp, B: -sequence_logps(token_lp[:B], batch["completion_mask"][:B], average=True),
}
"""Per-sequence tensors named in LOSS_EXTRAS: fn(batch, token_logps (2B, C), B) -> (B,)."""


def seq_logps(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence completion log-probs (N,) and token log-probs (N, C) of a collated batch (one forward)."""
    lp = completion_logps(
        model,
        batch["input_ids"],
        batch["attention_mask"],
        batch["completion_start"],
        completion_mask=batch["completion_mask"],
    )  # (N, C)
    return sequence_logps(lp, batch["completion_mask"]), lp


@torch.no_grad()
def reference_logps(ref_model, batches) -> torch.Tensor:
    """Concatenated per-sequence log-probs of ``ref_model`` over collated batches (no grad)."""
    return torch.cat([seq_logps(ref_model, b)[0] for b in batches])


# ---------------------------------------------------------------------------------------------
# paired and unpaired data: same interface, chosen by UNPAIRED_LOSSES


class PairedData:
    """(chosen, rejected) pairs; a batch is (2B, P + C), chosen rows first. Ref log-probs (N, 2) per pair."""

    def __init__(self, examples, tokenizer, cfg: DPOConfig):
        self.examples, self.tokenizer, self.cfg = examples, tokenizer, cfg

    def collate(self, idx: list[int]) -> dict:
        batch = collate_preference(
            [self.examples[i] for i in idx],
            self.tokenizer,
            max_prompt_length=self.cfg.max_prompt_length,
            max_completion_length=self.cfg.max_completion_length,
        )
        return device.to_device(batch)  # on the run's device (on the CPU: as it is)

    def precompute(self, ref_model, chunk: int = 256) -> torch.Tensor:
        out = []
        for s in range(0, len(self.examples), chunk):
            b = self.collate(list(range(s, min(s + chunk, len(self.examples)))))
            lp = reference_logps(ref_model, [b])  # (2n,)
            out.append(torch.stack(lp.chunk(2), dim=1))  # (n, 2) chosen, rejected
        return torch.cat(out)

    def loss_inputs(self, policy, ref_model, batch, ref_rows: torch.Tensor | None) -> dict:
        """Keyword arguments of a paired loss: policy/reference log-probs and the loss's declared extras."""
        B = batch["chosen_lengths"].shape[0]
        pol, token_lp = seq_logps(policy, batch)  # (2B,), (2B, C)
        kw = {"policy_chosen_logps": pol[:B], "policy_rejected_logps": pol[B:]}
        if ref_rows is None and ref_model is not None:
            ref_rows = torch.stack(reference_logps(ref_model, [batch]).chunk(2), dim=1)  # (B, 2)
        if ref_rows is not None:
            kw["ref_chosen_logps"], kw["ref_rejected_logps"] = ref_rows[:, 0], ref_rows[:, 1]
        for name in resolve_loss(self.cfg.loss).extras:
            kw[name] = EXTRA_INPUTS[name](batch, token_lp, B)
        return kw


class UnpairedData:
    """KTO's labelled completions; each batch also carries the mismatched KL batch. Ref log-probs (N, 1)."""

    def __init__(self, examples, tokenizer, cfg: DPOConfig):
        self.examples, self.tokenizer, self.cfg = examples, tokenizer, cfg

    def collate(self, idx: list[int]) -> dict:
        batch = collate_kto(
            [self.examples[i] for i in idx],
            self.tokenizer,
            max_prompt_length=self.cfg.max_prompt_length,
            max_completion_length=self.cfg.max_completion_length,
        )
        return device.to_device(batch)  # on the run's device (on the CPU: as it is)

    def precompute(self, ref_model, chunk: int = 256) -> torch.Tensor:
        out = []
        for s in range(0, len(self.examples), chunk):
            out.append(reference_logps(ref_model, [self.collate(list(range(s, min(s + chunk, len(self.examples)))))]))
        return torch.cat(out)[:, None]

    def loss_inputs(self, policy, ref_model, batch, ref_rows: torch.Tensor | None) -> dict:
        kl_batch = {k[3:]: v for k, v in batch.items() if k.startswith("kl_")}
        pol, _ = seq_logps(policy, batch)  # (B,)
        with torch.no_grad():  # z0 is detached: no gradient through the mismatched pairs
            pol_kl, _ = seq_logps(policy, kl_batch)
            ref_kl = reference_logps(ref_model, [kl_batch])
        ref = ref_rows[:, 0] if ref_rows is not None else reference_logps(ref_model, [batch])
        return {
            "policy_logps": pol,
            "ref_logps": ref,
            "labels": batch["labels"],
            "policy_kl_logps": pol_kl,
            "ref_kl_logps": ref_kl,
        }


def load_user_data(path: str, unpaired: bool, chat=None, on_bad_line: str = "error"):
    """Pairs file, or for KTO a {prompt, completion, label} file (a pairs file is split into both labels)."""
    first = next(iter(iter_records(path, on_bad_line=on_bad_line)), None)
    if first is None:
        raise UserError(f"{path}: no records (the file is empty)")
    kw = {"chat": chat, "on_bad_line": on_bad_line}
    if unpaired:
        return load_kto_examples(path, **kw) if "label" in first[1] else pairs_to_kto(load_preference_pairs(path, **kw))
    return load_preference_pairs(path, **kw)
