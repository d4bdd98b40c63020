"""Checks on user data as a model will see it: unknown characters, and lengths against the model's window.

Every loader that feeds a model (SFT demonstrations, evaluation prompts, DPO/KTO/RM pairs) encodes its
records through this module, once, at load time, so bad data fails before training with ``file:line``:

- **Unknown characters.** A character the tokenizer cannot represent becomes ``<unk>``. The counts
  (records, fields, characters; examples of the characters, escaped; the first ``file:line``) are
  printed once as a warning per file. A field whose text is not blank but encodes to nothing, or only
  to ``<unk>``, is a :class:`DataError` (SFT on it trains on nothing). A pair whose ``chosen`` and
  ``rejected`` encode to the same tokens (they differ only in unknown characters) is a DataError too:
  DPO would see a margin of exactly 0.
- **Lengths.** The window is ``max_seq_len`` for training sequences (prompt + completion, BOS and EOS
  included) and ``max_seq_len - max_new_tokens`` for prompts the model generates from. The policy
  ``long`` (the ``--long`` flag of ``sft``, ``dpo``, ``rm`` and ``eval``) decides what a longer record does:

  ``error`` (default)  DataError naming ``file:line`` and the lengths;
  ``truncate``         the prompt keeps BOS and its *last* tokens, the completion its *first* tokens (EOS
                       may be cut). The prompt keeps at least half the window when it needs that much; the
                       completion gets the rest. A generation prompt keeps its last tokens. A pair whose
                       chosen and rejected become identical is dropped (counted);
  ``skip``             the record is dropped; the count and the first ``file:line`` are printed.

  Memory is bounded before encoding: a field longer than ``window x chars_per_token`` characters is too
  long without being encoded (``chars_per_token`` is 1 for the char tokenizer, where it is exact, and 64
  for subword tokenizers); under ``truncate`` only that many characters (its end for a prompt, its start
  for a completion) are encoded, so the cut of such a field is approximate at the slice boundary.
  (``iter_jsonl`` rejects a line over 64 MiB before parsing it.)

Not handled: a subword tokenizer's unknown *characters* cannot be listed (only its ``<unk>`` tokens are
counted); byte-level BPE and byte fallback never produce ``<unk>``.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from collections.abc import Callable, Sequence

from posttrain.errors import ConfigError, DataError
from posttrain.text import printable

LONG_POLICIES = ("error", "truncate", "skip")
SUBWORD_CHARS_PER_TOKEN = 64


class Located(list):
    """A list of records that remembers the file line of each: ``where(i)`` -> ``"data.jsonl:17"``."""

    def __init__(self, items=(), source: str | None = None, lines: Sequence[int] | None = None):
        super().__init__(items)
        self.source = source
        self.lines = list(lines) if lines is not None else None

    def where(self, i: int) -> str:
        if self.source is None or self.lines is None:
            return f"record {i + 1}"
        return f"{self.source}:{self.lines[i]}"

    def subset(self, idx: Sequence[int], items: Sequence | None = None) -> "Located":
        """The records at ``idx`` (or ``items``, one per index), keeping their lines."""
        items = [self[i] for i in idx] if items is None else items
        return Located(items, self.source, [self.lines[i] for i in idx] if self.lines is not None else None)


def where(records, i: int, default: str = "record") -> str:
    return records.where(i) if isinstance(records, Located) else f"{default} {i + 1}"


def check_long_policy(value: str) -> str:
    if value not in LONG_POLICIES:
        raise ConfigError(f"long={value!r} is not valid; choose one of: {', '.join(LONG_POLICIES)}")
    return value


def model_window(model) -> int | None:
    """The model's context length (posttrain GPT ``max_seq_len``, HF ``max_position_embeddings``/``n_positions``);
    a reward model's is its backbone's. None when unknown (no length check)."""
    for _ in range(3):  # RewardModel -> GPTBackbone -> GPT
        if model is None or getattr(model, "config", None) is not None:
            break
        model = getattr(model, "backbone", None) or getattr(model, "model", None)
    cfg = getattr(model, "config", None)
    for name in ("max_seq_len", "max_position_embeddings", "n_positions"):
        v = getattr(cfg, name, None)
        if isinstance(v, int) and v > 0:
            return v
    return None


def _chars_per_token(tokenizer) -> int:
    return 1 if getattr(tokenizer, "type", None) == "char" else SUBWORD_CHARS_PER_TOKEN


class FieldEncoder:
    """Encodes the fields of one file with one tokenizer, counting unknowns; ``finish()`` warns once."""

    def __init__(self, tokenizer, what: str, source: str | None = None, warn: Callable[[str], None] | None = None):
        self.tok, self.what, self.source = tokenizer, what, source
        self.unk = getattr(tokenizer, "unk_id", None)
        self.warn = warn or _warn
        self.records: set[int] = set()
        self.fields = 0
        self.unknown = 0
        self.examples: Counter = Counter()
        self.first: str | None = None

    def encode(self, text: str, field: str, i: int, loc: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS) for field ``field`` of record ``i`` at ``loc``; raises a
        DataError when a non-empty text encodes to nothing or only to ``<unk>``."""
        ids = list(self.tok.encode(text))
        self._count(text, ids, field, i, loc)
        return ids

    def _count(self, text: str, ids: list[int], field: str, i: int, loc: str) -> None:
        n_unk = sum(1 for t in ids if t == self.unk) if self.unk is not None else 0
        if text.strip() and not ids:
            raise DataError(
                f"{loc}: field {field!r} ('{printable(text, 40)}') encodes to no tokens with this tokenizer"
            )
        if n_unk and n_unk == len(ids):
            raise DataError(
                f"{loc}: every character of field {field!r} ('{printable(text, 40)}') is unknown to the "
                f"tokenizer (all <unk>): nothing to learn from; is this the right tokenizer for the data?"
            )
        if n_unk:
            self.records.add(i)
            self.fields += 1
            self.unknown += n_unk
            self.first = self.first or loc
            chars = getattr(self.tok, "unknown_chars", None)
            if chars is not None and len(self.examples) < 8:
                self.examples.update(chars(text))

    def finish(self) -> None:
        if not self.unknown:
            return
        src = f" in {self.source}" if self.source else ""
        if self.examples:
            eg = ", ".join(f"'{printable(c)}'" for c, _ in self.examples.most_common(5))
            what = f"{self.unknown} character(s) not in the tokenizer's alphabet (e.g. {eg}) became <unk>"
        else:
            what = f"{self.unknown} <unk> token(s)"
        self.warn(
            f"{self.what} data{src}: {what}, in {self.fields} field(s) of {len(self.records)} record(s); "
            f"first at {self.first}"
        )


def _warn(msg: str) -> None:
    print(f"posttrain: warning: {msg}", file=sys.stderr)


@dataclasses.dataclass
class Fitted:
    prompt: list[int]
    completions: list[list[int]]


def _fit(prompt: list[int], comps: list[list[int]], window: int, has_bos: bool) -> Fitted | None:
    """Cut (prompt, completions) into ``window`` tokens (see the module docstring); None when impossible."""
    if not comps:
        keep = window
        if keep < 1:
            return None
        return Fitted(_keep_last(prompt, keep, has_bos), [])
    C = max(len(c) for c in comps)
    P = len(prompt)
    p_keep = max(window - C, min(P, window // 2), 1)
    c_keep = window - p_keep
    if c_keep < 1:
        return None
    return Fitted(_keep_last(prompt, p_keep, has_bos), [c[:c_keep] for c in comps])


def _keep_last(ids: list[int], n: int, has_bos: bool) -> list[int]:
    if len(ids) <= n:
        return ids
    if has_bos and n >= 2:
        return ids[:1] + ids[len(ids) - (n - 1) :]
    return ids[len(ids) - n :]


class LengthPolicy:
    """Applies ``long`` to records over ``window`` tokens; ``finish()`` prints what was skipped or cut."""

    def __init__(
        self,
        long: str,
        window: int | None,
        what: str,
        source: str | None,
        generate: int = 0,
        warn: Callable[[str], None] | None = None,
    ):
        self.long, self.window, self.what, self.source, self.generate = (
            check_long_policy(long),
            window,
            what,
            source,
            generate,
        )
        self.warn = warn or _warn
        self.skipped: list[str] = []
        self.truncated: list[str] = []
        self.identical: list[str] = []

    def char_limit(self, tokenizer) -> int | None:
        return None if self.window is None else max(self.window, 1) * _chars_per_token(tokenizer)

    def too_long(self, loc: str, detail: str) -> None:
        """Called for a record over the window: raise (error), or note the skip/cut."""
        budget = f"max_seq_len {self.window + self.generate}" + (
            f" - {self.generate} new tokens" if self.generate else ""
        )
        if self.long == "error":
            raise DataError(
                f"{loc}: {detail}, over the model's window of {self.window} tokens ({budget}); shorten it, "
                f"or pass --long truncate (keep the prompt's end) or --long skip"
            )
        (self.skipped if self.long == "skip" else self.truncated).append(loc)

    def finish(self, kept: int) -> None:
        src = f" in {self.source}" if self.source else ""
        if self.skipped:
            self.warn(
                f"{self.what} data{src}: skipped {len(self.skipped)} record(s) longer than the model's window "
                f"of {self.window} tokens (first at {self.skipped[0]}; --long truncate would keep them cut)"
            )
        if self.truncated:
            self.warn(
                f"{self.what} data{src}: truncated {len(self.truncated)} record(s) to the model's window of "
                f"{self.window} tokens (prompts keep their last tokens, completions their first; first at "
                f"{self.truncated[0]})"
            )
        if self.identical:
            self.warn(
                f"{self.what} data{src}: dropped {len(self.identical)} pair(s) whose chosen and rejected became "
                f"identical when cut to length (first at {self.identical[0]})"
            )
        if kept == 0:
            raise DataError(f"{self.what} data{src}: no records left after the length check (--long {self.long})")


def fit_sequences(
    tokenizer,
    records: Sequence,
    fields: Callable[[object], tuple[str, list[tuple[str, str]]]],
    *,
    window: int | None,
    long: str = "error",
    what: str,
    generate: int = 0,
    add_bos: bool = True,
    add_eos: bool = True,
    max_prompt_length: int | None = None,
    max_completion_length: int | None = None,
    distinct: bool = False,
    also: Callable[[object], list[tuple[str, str]]] | None = None,
    warn: Callable[[str], None] | None = None,
) -> tuple[list[int], list[Fitted]]:
    """Encode and length-check records: ``fields(rec)`` -> (prompt text, [(field name, completion text)]).

    Returns (indices of the kept records, their fitted token ids). BOS/EOS are added as in training; the
    ``max_*_length`` caps (the trainers' own truncation knobs) are applied before the window check.
    ``distinct``: completions must not encode identically (preference pairs). ``also(rec)`` names fields
    that are checked for unknown characters but are not part of the sequence (an evaluation answer).
    """
    if window is not None and window < 1:
        raise ConfigError(
            f"max_new_tokens={generate} leaves no room for a prompt in the model's max_seq_len={window + generate}"
        )
    source = getattr(records, "source", None)
    enc = FieldEncoder(tokenizer, what, source, warn)
    pol = LengthPolicy(long, window, what, source, generate, warn)
    bos = tokenizer.bos_id if add_bos else None
    eos = tokenizer.eos_id if add_eos else None
    limit = pol.char_limit(tokenizer)
    kept, out = [], []
    for i, rec in enumerate(records):
        loc = where(records, i)
        prompt_text, comp_fields = fields(rec)
        ids, over = _encode_fields(enc, pol, limit, prompt_text, comp_fields, i, loc)
        if ids is None:
            continue
        for name, text in also(rec) if also is not None else ():
            if limit is None or len(text) <= limit:
                enc.encode(text, name, i, loc)
        prompt, comps = _add_specials(ids, comp_fields, bos, eos, max_prompt_length)
        if distinct and len(comps) == 2 and comps[0] == comps[1] and not over:
            raise DataError(
                f"{loc}: {comp_fields[0][0]!r} and {comp_fields[1][0]!r} encode to the same tokens (they "
                f"differ only in characters this tokenizer maps to <unk>, or in what it drops): the pair "
                f"carries no preference"
            )
        if max_completion_length is not None:
            comps = [c[:max_completion_length] for c in comps]
        fitted = _fit_window(pol, window, prompt, comps, comp_fields, over, loc, bos is not None)
        if fitted is None:  # skipped (--long skip)
            continue
        if distinct and len(fitted.completions) == 2 and fitted.completions[0] == fitted.completions[1]:
            pol.identical.append(loc)  # identical only once cut (max_completion_length or --long truncate)
            continue
        kept.append(i)
        out.append(fitted)
    enc.finish()
    pol.finish(len(kept))
    return kept, out


def _encode_fields(enc, pol, limit, prompt_text: str, comp_fields, i: int, loc: str):
    """Token ids of the prompt and each completion field, and what was over the character limit (checked
    before encoding). (None, over) when the record is too long and is not to be truncated."""
    named = [("prompt", prompt_text, True)] + [(n, t, False) for n, t in comp_fields]
    ids, over = {}, []
    for name, text, is_prompt in named:
        if limit is not None and len(text) > limit:
            over.append(f"{name} has {len(text)} characters (too many, checked before encoding)")
            if pol.long != "truncate":
                break
            text = text[len(text) - limit :] if is_prompt else text[:limit]
        ids[name] = enc.encode(text, name, i, loc)
    if over and pol.long != "truncate":
        pol.too_long(loc, over[0])
        return None, over
    return ids, over


def _add_specials(ids: dict, comp_fields, bos, eos, max_prompt_length):
    """[BOS] + prompt (its last ``max_prompt_length`` tokens) and each completion + [EOS], as in training."""
    prompt = ([int(bos)] if bos is not None else []) + ids["prompt"]
    if max_prompt_length is not None and len(prompt) > max_prompt_length:
        prompt = prompt[len(prompt) - max_prompt_length :]
    return prompt, [ids[name] + ([int(eos)] if eos is not None else []) for name, _ in comp_fields]


def _fit_window(pol, window, prompt, comps, comp_fields, over, loc: str, has_bos: bool) -> Fitted | None:
    """The record as fitted to the model's window under the length policy (None: skipped)."""
    fitted = Fitted(prompt, comps)
    total = len(prompt) + max((len(c) for c in comps), default=0)
    if not over and (window is None or total <= window):
        return fitted
    if over:
        detail = over[0]
    elif comps:
        j = max(range(len(comps)), key=lambda k: len(comps[k]))
        detail = f"prompt {len(prompt)} + {comp_fields[j][0]} {len(comps[j])} = {total} tokens"
    else:
        detail = f"prompt is {len(prompt)} tokens"
    pol.too_long(loc, detail)
    if pol.long == "skip":
        return None
    fitted = _fit(prompt, comps, window, has_bos)
    if fitted is None:
        raise DataError(f"{loc}: the model's window of {window} tokens leaves no room for this record")
    return fitted
