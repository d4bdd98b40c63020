"""Digit-slot positions: every operand's digits right-aligned into fixed position slots, as if zero-padded.

Key insight: with learned absolute positions a model that has learned ``"ab+cd="`` puts the units rule at the
positions of the ``2+2`` layout (80 % of two-digit problems), and ``"a+cd="`` moves every digit after ``a`` one
place left: the one-digit layouts stay near 0.1 after SFT and GRPO (docs/outcomes.md). Giving each digit the
position of its place value instead (the idea of McLeish et al. 2024's Abacus embeddings, here through GPT-2's own
position table, no new weights) makes every layout look like ``2+2`` with a digit missing. For operands of at
most D digits, in a row ``[BOS] x_1..x_m op y_1..y_n = z_1 z_2 ...`` (left padding before BOS gets 0):

    pos(BOS) = 0,   pos(x_i) = D - (m - i),   pos(op) = D + 1,   pos(y_i) = 2D + 1 - (n - i),
    pos(=) = 2D + 2,   pos(z_k) = 2D + 2 + k

so units digits sit at D and 2D + 1 and the answer at 2D + 3.. for every layout. Rows that are not such a
problem (no BOS, no operator or ``=``, an operand longer than D or with a non-digit) keep the caller's positions.
The token ids are those of the character tokenizer of :data:`SLOT_ALPHABET` (``CharTokenizer(SLOT_ALPHABET)``, the
alphabet of the embedded arithmetic task, which keeps the same string: a task test checks that the two agree; this
module imports no task); a model trained this way must be run with these positions, which Hugging Face's GPT-2 does
not compute (``posttrain export`` refuses it).

Here: :func:`slot_positions` (vectorised), :func:`slot_positions_reference` (one row at a time, the oracle),
:func:`slot_digits` (a model's D, 0 = off) and :func:`model_positions` (what every caller uses).
"""

from __future__ import annotations

import torch

from posttrain.errors import ConfigError
from posttrain.tokenizers.char import CharTokenizer

SLOT_ALPHABET = "0123456789+-="
"""The characters whose ids the slots read: digits, operators and ``=`` of a character tokenizer over these."""
_TOK = CharTokenizer(SLOT_ALPHABET)
BOS = _TOK.bos_id
DIGITS = tuple(_TOK.encode("0123456789"))  # consecutive ids
OPS = tuple(_TOK.encode("+-"))
EQ = _TOK.encode("=")[0]


def slot_digits(model) -> int:
    """D of a posttrain GPT (possibly wrapped: LoRA, a reward or value backbone) with ``config.digit_slots``; else 0."""
    for m in (model, getattr(model, "model", None), getattr(model, "base_model", None)):
        d = getattr(getattr(m, "config", None), "digit_slots", 0)
        if isinstance(d, int) and d > 0:
            return d
    return 0


def check_tokenizer(tokenizer, digits: int, task_digits: int) -> None:
    """With ``digits`` > 0: ConfigError unless ``tokenizer`` is the embedded task's character tokenizer (the ids above)
    and the task's operands fit ``digits`` slots; otherwise no row would be recognised and the option would do nothing."""
    if not digits:
        return
    if getattr(tokenizer, "type", None) != "char" or getattr(tokenizer, "alphabet", None) != SLOT_ALPHABET:
        raise ConfigError(
            f"model.digit_slots={digits} needs the embedded task's character tokenizer (alphabet {SLOT_ALPHABET!r}, no "
            "--tokenizer, no chat template): it finds the operands by their token ids"
        )
    if task_digits > digits:
        raise ConfigError(
            f"model.digit_slots={digits} is fewer than the task's operand digits (task.digits={task_digits})"
        )


def model_positions(model, input_ids: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """The position ids ``model`` runs ``input_ids`` (B, T) at: digit slots if it has them, else ``fallback``."""
    d = slot_digits(model)
    return slot_positions(input_ids, fallback, d) if d else fallback


def slot_positions(input_ids: torch.Tensor, fallback: torch.Tensor, digits: int) -> torch.Tensor:
    """(B, T) token ids -> (B, T) digit-slot positions; rows that are not a problem keep ``fallback``'s."""
    B, T = input_ids.shape
    j = torch.arange(T, device=input_ids.device).expand(B, T)
    is_digit = (input_ids >= DIGITS[0]) & (input_ids <= DIGITS[-1])
    is_op = (input_ids == OPS[0]) | (input_ids == OPS[1])

    def first(m: torch.Tensor) -> torch.Tensor:  # (B,) index of the first True, T where none
        return torch.where(m, j, T).min(-1).values

    bos = first(input_ids == BOS)
    op = first(is_op & (j > bos[:, None]))
    eq = first((input_ids == EQ) & (j > op[:, None]))
    m, n = op - bos - 1, eq - op - 1  # the operands' lengths
    inside = ((j > bos[:, None]) & (j < op[:, None])) | ((j > op[:, None]) & (j < eq[:, None]))
    valid = (eq < T) & (m >= 1) & (m <= digits) & (n >= 1) & (n <= digits) & ~(inside & ~is_digit).any(-1)
    slot = torch.where(j > op[:, None], 2 * digits + 2 + j - eq[:, None], digits + 1 + j - op[:, None])
    slot = torch.where(j <= bos[:, None], 0, slot)
    return torch.where(valid[:, None], slot, fallback)


def slot_positions_reference(ids: list[int], fallback: list[int], digits: int) -> list[int]:
    """One row, by the formula in the docstring, written out: the test oracle of :func:`slot_positions`."""
    try:
        b = ids.index(BOS)
        o = next(i for i in range(b + 1, len(ids)) if ids[i] in OPS)
        e = ids.index(EQ, o + 1)
    except (ValueError, StopIteration):
        return list(fallback)
    x, y = ids[b + 1 : o], ids[o + 1 : e]
    if not (1 <= len(x) <= digits and 1 <= len(y) <= digits) or any(t not in DIGITS for t in x + y):
        return list(fallback)
    pos = [0] * (b + 1)
    pos += [digits - (len(x) - 1 - i) for i in range(len(x))] + [digits + 1]
    pos += [2 * digits + 1 - (len(y) - 1 - i) for i in range(len(y))] + [2 * digits + 2]
    pos += [2 * digits + 2 + k for k in range(1, len(ids) - e)]
    return pos
