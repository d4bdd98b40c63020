"""How a reward-model step forms and scores its batch: by pair, or by prompt with each completion run once.

Key insight (InstructGPT, Ouyang et al. 2022, sec. 3.5): the K completions of a prompt give up to K(K-1)/2
comparisons, but each needs only ONE forward of the RM. Scoring the distinct completions of a prompt once and
reading every pair off those scores gives the same Bradley-Terry loss on the same pairs for a fraction of the work:

    batch_by = "pair":    rows = [chosen_1..B | rejected_1..B]         L = mean_b -log sigma(r[b] - r[B+b])
    batch_by = "prompt":  rows = distinct (prompt, completion)s of the batch's prompts, each once,
                          pairs = (chosen row, rejected row) indices   L = mean_pairs -log sigma(r[c] - r[w])

With a posttrain GPT backbone the prompt itself also runs once for all its rows (``scoring.shared_prefix_forward``:
its keys/values gathered to the rows, exact). An arithmetic prompt with one correct answer and 8 distinct wrong
ones is then 9 completions and one prompt instead of 16 full sequences: ~4x fewer token positions per pair.
``batch_by = "prompt"`` makes ``batch_size`` count prompts (each with all its pairs); with "pair" it counts pairs.

Not handled: grouping prompts whose text differs only in whitespace (groups are by exact prompt tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from posttrain.data.preference import PreferencePair, pack_prompt_completion, padding_id, pair_margins, pair_tokens
from posttrain.losses.logprobs import masked_mean, token_logps
from posttrain.models.gpt import GPT
from posttrain.models.heads import GPTBackbone, RewardModel
from posttrain.scoring import completion_logps, shared_prefix_forward

BATCH_BY = ("pair", "prompt")


def shares_prompt(rm: RewardModel) -> bool:
    """Whether the prompt can run once for all its rows: a posttrain GPT backbone (its ``cache`` takes any cache
    object, LoRA layers included); a Hugging Face backbone runs the full forward."""
    return isinstance(rm.backbone, GPTBackbone) and isinstance(rm.backbone.model, GPT)


def has_lm_head(rm: RewardModel) -> bool:
    """Whether the backbone is a language model whose head the GRM term can read: posttrain's GPT, or a Hugging Face
    causal LM (an encoder has none)."""
    if shares_prompt(rm):
        return True
    get = getattr(rm.backbone.model, "get_output_embeddings", None)
    return get is not None and get() is not None


def row_rewards(rm: RewardModel, batch: dict, share_prompt: bool, lm_rows: torch.Tensor | None = None):
    """(N,) rewards of the rows of a packed [prompt | completion] batch with a ``prompt_index`` (N,).

    With ``share_prompt`` (and :func:`shares_prompt`) rows with the same ``prompt_index`` run their prompt once and
    the head reads the last real completion token: the same rewards and gradients as ``rm(input_ids, mask)``.
    With ``lm_rows`` it returns ``(rewards, nll)``: ``nll`` the mean token negative log-likelihood of those rows'
    completions under the backbone's own LM head (the GRM regulariser, :func:`chosen_nll`), read off the same
    forward for a posttrain GPT, from a second forward of the causal LM over those rows for a Hugging Face backbone.
    """
    ids, attn, P = batch["input_ids"], batch["attention_mask"], batch["completion_start"]
    if not shares_prompt(rm) or (lm_rows is None and not share_prompt):
        r = rm(ids, attn)
        if lm_rows is None:
            return r
        mask = batch["completion_mask"][lm_rows]
        lp = completion_logps(rm.backbone.model, ids[lm_rows], attn[lm_rows], P, completion_mask=mask)  # (M, C)
        return r, chosen_nll(lp, mask)
    out = shared_prefix_forward(rm.backbone.model, ids, attn, P, batch["prompt_index"], output_hidden_states=True)
    r = rm.head(out.hidden, attn[:, P:])  # every completion has a real token (pack_prompt_completion checks)
    if lm_rows is None:
        return r
    logits = torch.cat([out.last_logits[lm_rows, None], out.logits[lm_rows, :-1]], dim=1)  # (M, C, V)
    return r, chosen_nll(token_logps(logits, ids[lm_rows, P:]), batch["completion_mask"][lm_rows])


def chosen_nll(logps: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the completion tokens (EOS included) where ``mask`` is 1: (M, C), (M, C) ->
    scalar, from the tokens' log-probs under the backbone's LM head.

    The generalisable-RM regulariser (GRM, Yang et al. 2024): keep the backbone a language model of the *chosen*
    answers while the head learns to rank, ``L = L_BT + sft_coef * nll(chosen)``, so its hidden states stay
    features of what a right answer is.
    """
    return -masked_mean(logps, mask)


def batch_rewards(rm: RewardModel, batch: dict, share_prompt: bool, lm_rows: torch.Tensor | None = None):
    """(2B,) rewards of a :func:`collate_preference` batch (chosen rows, then rejected rows); with ``share_prompt``
    each pair's prompt runs once for both its completions, with ``lm_rows`` also the NLL (:func:`row_rewards`)."""
    B = batch["input_ids"].shape[0] // 2
    pair = torch.arange(B, device=batch["input_ids"].device).repeat(2)  # rows i and B + i are pair i's
    return row_rewards(rm, {**batch, "prompt_index": pair}, share_prompt, lm_rows)


def prompt_groups(pairs: Sequence[PreferencePair]) -> list[list[int]]:
    """Indices of the pairs of each distinct prompt, prompts in first-seen order (by prompt tokens once
    ``fit_pairs`` encoded them, else by text).

    Example: prompts ["1+1=", "2+2=", "1+1="] -> [[0, 2], [1]].
    """
    groups: dict = {}
    for i, p in enumerate(pairs):
        key = tuple(p.tokens[0]) if p.tokens is not None else p.prompt
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def collate_prompt_groups(
    pairs: Sequence[PreferencePair],
    groups: Sequence[Sequence[int]],
    tokenizer,
    *,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
) -> dict:
    """One row per distinct (prompt, completion) of the ``groups`` (lists of pair indices into ``pairs``, one list
    per prompt). Returns the packed rows (``input_ids``, ``attention_mask``, ``completion_mask``,
    ``completion_start``), ``prompt_index`` (N,) the row's group, ``chosen_rows`` / ``rejected_rows`` (M,) each
    pair's rows, and ``margin`` (M,) when every pair has one.

    Example: pairs ("1+1=", "2", "3"), ("1+1=", "2", "4") -> rows "2", "3", "4"; chosen_rows [0, 0],
    rejected_rows [1, 2].
    """
    if not groups or not all(groups):
        raise ValueError("collate_prompt_groups needs at least one non-empty group")
    flat = [pairs[i] for g in groups for i in g]
    group_of = [g for g, group in enumerate(groups) for _ in group]
    caps = dict(max_prompt_length=max_prompt_length, max_completion_length=max_completion_length)
    prompts_tok, chosen_tok, rejected_tok = pair_tokens(flat, tokenizer, **caps)  # as the pair batches encode them
    prompts, comps, prompt_index, rows = [], [], [], {}

    def row(k: int, completion: list[int]) -> int:  # the row of (pair k's prompt, completion), added once
        key = (group_of[k], tuple(completion))
        if key not in rows:
            rows[key] = len(comps)
            prompts.append(prompts_tok[k])
            comps.append(list(completion))
            prompt_index.append(group_of[k])
        return rows[key]

    chosen = [row(k, c) for k, c in enumerate(chosen_tok)]
    rejected = [row(k, r) for k, r in enumerate(rejected_tok)]
    batch = pack_prompt_completion(prompts, comps, padding_id(tokenizer))
    batch["prompt_index"] = torch.tensor(prompt_index)
    batch["chosen_rows"], batch["rejected_rows"] = torch.tensor(chosen), torch.tensor(rejected)
    margins = pair_margins(flat)
    if margins is not None:
        batch["margin"] = margins
    return batch
