"""Local Hugging Face model directories: read a model and its tokenizer, write them back in the same layout.

Key insight: the directory ``save_pretrained`` writes is the interchange format every tool reads
(``AutoModelForCausalLM.from_pretrained``, vLLM), so posttrain reads it as it is and writes its trained
Hugging Face models the same way, with its own training state beside it::

    config.json  generation_config.json  model.safetensors           the model (transformers' files)
    tokenizer.json  tokenizer_config.json  [special_tokens_map.json, chat_template.jinja, ...]
    adapter_config.json  adapter_model.safetensors                    LoRA adapters, when trained with them
    trainer_state.json  optimizer.pt  rng.pt                          posttrain's (checkpoint.py)

The tokenizer: ``tokenizer.json`` through posttrain's own reader (:func:`posttrain.tokenizers.load`) when
it can read it, else transformers' ``AutoTokenizer``; either is wrapped in :class:`ModelTokenizer`, which
takes pad/eos/bos from ``tokenizer_config.json`` (then ``special_tokens_map.json``; eos/bos also from
``config.json``'s ``*_token_id``) and keeps the directory's tokenizer files byte for byte, so a saved
checkpoint carries the same tokenizer (and chat template) transformers would load. A tokenizer without a
pad token needs ``--pad-token TOKEN`` (a one-line error otherwise), which is then written into the saved
``tokenizer_config.json``.

Not handled: sharded or ``.bin`` weights are read (``from_pretrained``) but always written as one
``model.safetensors``; models needing ``trust_remote_code``; tokenizers without an eos token.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from posttrain.config import knob
from posttrain.errors import UserError

POSTTRAIN_TYPES = ("posttrain-gpt", "hf")  # config.json model_type of posttrain's own (wrapped) layouts
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)


def model_path_knob():
    return knob(
        None,
        "start from this local Hugging Face model directory (config.json, *.safetensors, tokenizer "
        "files) or posttrain checkpoint, with its tokenizer",
        flag="--model",
    )


def pad_token_knob():
    return knob(
        None,
        "pad token for a model whose tokenizer has none (e.g. '<|endoftext|>'); saved into the "
        "output's tokenizer_config.json",
    )


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("Hugging Face models need transformers: pip install 'posttrain[hf]'") from None
    return transformers


@contextlib.contextmanager
def _quiet():
    """No 'Loading weights' / 'Writing model shards' bars from transformers in a training log."""
    log = _transformers().utils.logging
    was = log.is_progress_bar_enabled()
    log.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            log.enable_progress_bar()


def read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path}: not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def is_hf_model_dir(path: str | Path) -> bool:
    """A directory whose config.json is transformers' own (not posttrain's wrapped ``{"model_type": "posttrain-gpt"}``)."""
    f = Path(path) / "config.json"
    if not f.is_file():
        return False
    try:
        mt = json.loads(f.read_text(encoding="utf-8")).get("model_type")
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False
    return isinstance(mt, str) and mt not in POSTTRAIN_TYPES


def lora_base_dir(model: torch.nn.Module, state: dict) -> Path | None:
    """The directory holding ``model``'s frozen base, for a run's final ``model/`` to point at instead of copying
    it: the run config's ``model_path`` (or ``init``) when it is a full Hugging Face model directory (no adapter of
    its own) and ``model`` is a transformers model with LoRA adapters; else None (the base is written out)."""
    from posttrain.models.lora import ADAPTER_CONFIG, has_lora

    if not has_lora(model) or not hasattr(model, "save_pretrained"):
        return None
    cfg = state.get("config") or {}
    for key in ("model_path", "init"):
        d = cfg.get(key)
        if d and is_hf_model_dir(d) and not (Path(d) / ADAPTER_CONFIG).is_file():
            return Path(d).resolve()
    return None


# ---------------------------------------------------------------------------------------------
# tokenizer


def _token(v) -> str | None:
    if isinstance(v, dict):
        v = v.get("content")
    return v if isinstance(v, str) else None


class ModelTokenizer:
    """A model directory's tokenizer behind posttrain's Tokenizer protocol (``tokenizers/base.py``).

    ``encode`` adds no special tokens (posttrain's contract; special tokens written in the text map to their
    ids), ``decode`` drops them unless asked; ``pad_id``/``eos_id``/``bos_id`` come from the tokenizer's config.
    ``backend`` is ``"posttrain"`` (posttrain's reader) or ``"transformers"`` (``AutoTokenizer``).
    """

    def __init__(
        self,
        inner,
        files: dict[str, bytes],
        *,
        roles: dict[str, str | None],
        backend: str,
        source: Path,
        pad_override: str | None = None,
        chat_template: str | None = None,
    ):
        self.inner, self.files, self.backend, self.source = inner, dict(files), backend, source
        self.pad_override, self.chat_template = pad_override, chat_template
        self.tokens = dict(roles)  # role -> token string
        self._ids = {}
        for role, tok in roles.items():
            i = None if tok is None else self.token_to_id(tok)
            if tok is not None and i is None:
                raise UserError(f"{source}: the {role} token {tok!r} is not in the tokenizer's vocabulary")
            self._ids[role] = i

    # --- protocol -----------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return len(self.inner) if self.backend == "transformers" else self.inner.vocab_size

    pad_id = property(lambda self: self._ids["pad"])
    bos_id = property(lambda self: self._ids["bos"])
    eos_id = property(lambda self: self._ids["eos"])

    def encode(self, text: str) -> list[int]:
        if self.backend == "transformers":
            return list(self.inner.encode(text, add_special_tokens=False))
        return self.inner.encode(text)

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if self.backend == "transformers":
            return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        if self.backend == "transformers":
            i = self.inner.convert_tokens_to_ids(token)
            return None if i is None or (i == self.inner.unk_token_id and token != self.inner.unk_token) else int(i)
        return self.inner.token_to_id(token)

    def id_to_token(self, idx: int) -> str | None:
        if self.backend == "transformers":
            return self.inner.convert_ids_to_tokens(int(idx))
        return self.inner.id_to_token(idx)

    def save(self, path: str | Path) -> None:
        """Write the directory's tokenizer files (``path``: a directory, or its ``tokenizer.json``)."""
        p = Path(path)
        d = p.parent if p.name == "tokenizer.json" else p
        d.mkdir(parents=True, exist_ok=True)
        for name, data in self.files.items():
            if name == "tokenizer_config.json" and self.pad_override is not None:
                cfg = json.loads(data.decode("utf-8"))
                cfg["pad_token"] = self.pad_override
                data = (json.dumps(cfg, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
            (d / name).write_bytes(data)

    def __repr__(self) -> str:
        return f"ModelTokenizer({self.source}, backend={self.backend!r}, vocab_size={self.vocab_size})"


def load_model_tokenizer(directory: str | Path, pad_token: str | None = None) -> ModelTokenizer:
    """The tokenizer of model directory ``directory`` (see the module docstring); ``pad_token`` overrides its pad."""
    d = Path(directory)
    files = {n: (d / n).read_bytes() for n in TOKENIZER_FILES if (d / n).is_file()}
    if not files:
        raise UserError(
            f"{d}: no tokenizer files (tokenizer.json, tokenizer_config.json, ...): a model directory "
            f"needs its tokenizer beside config.json"
        )
    tcfg = read_json(d / "tokenizer_config.json") if "tokenizer_config.json" in files else {}
    smap = read_json(d / "special_tokens_map.json") if "special_tokens_map.json" in files else {}
    inner, backend, why = None, "posttrain", ""
    if "tokenizer.json" in files:
        from posttrain.tokenizers import load

        try:
            inner = load(d / "tokenizer.json")
        except UserError as e:
            why = str(e)
    if inner is None:
        backend = "transformers"
        try:
            inner = _transformers().AutoTokenizer.from_pretrained(str(d), local_files_only=True)
        except Exception as e:
            raise UserError(
                f"{d}: cannot load the tokenizer ({why + '; ' if why else ''}transformers: "
                f"{str(e).splitlines()[0] if str(e) else type(e).__name__})"
            ) from None
    roles = {r: _token(tcfg.get(f"{r}_token", smap.get(f"{r}_token"))) for r in ("pad", "bos", "eos")}
    cfg = read_json(d / "config.json") if (d / "config.json").is_file() else {}
    tok = ModelTokenizer(inner, files, roles=roles, backend=backend, source=d, chat_template=_chat_template(d, tcfg))
    for role in ("pad", "eos", "bos"):  # no tokenizer_config.json (posttrain's own file): its conventional names
        if tok._ids[role] is None and backend == "posttrain" and not tcfg:
            tok._ids[role] = getattr(inner, f"{role}_id", None)
    for role in ("eos", "bos"):  # not in the tokenizer's config: the model's own ids
        if tok._ids[role] is None and isinstance(cfg.get(f"{role}_token_id"), (int, list)):
            v = cfg[f"{role}_token_id"]
            tok._ids[role] = int(v[0] if isinstance(v, list) else v)
    if pad_token is not None:
        i = tok.token_to_id(pad_token)
        if i is None:
            raise UserError(f"--pad-token {pad_token!r} is not a token of {d}'s tokenizer")
        tok._ids["pad"], tok.tokens["pad"], tok.pad_override = i, pad_token, pad_token
    if tok.pad_id is None:
        hint = (
            f", e.g. --pad-token {tok.tokens['eos'] or tok.id_to_token(tok.eos_id)!r}" if tok.eos_id is not None else ""
        )
        raise UserError(
            f"{d}: the tokenizer has no pad token (tokenizer_config.json pad_token): pass --pad-token TOKEN{hint}"
        )
    if tok.eos_id is None:
        raise UserError(
            f"{d}: the tokenizer has no eos token (tokenizer_config.json eos_token): completions could never end"
        )
    return tok


def _chat_template(d: Path, tcfg: dict) -> str | None:
    if (d / "chat_template.jinja").is_file():
        return (d / "chat_template.jinja").read_text(encoding="utf-8")
    t = tcfg.get("chat_template")
    return t if isinstance(t, str) else None


# ---------------------------------------------------------------------------------------------
# model


def load_hf_model(
    directory: str | Path, dtype: torch.dtype = torch.float32, attn_implementation: str | None = None
) -> torch.nn.Module:
    """A causal LM from a local model directory (never downloads); a LoRA adapter saved there is attached.
    ``attn_implementation`` ("sdpa", "eager", "flash_attention_2", ...) is passed to transformers when given (its
    default otherwise: SDPA where torch has it)."""
    from posttrain.models.lora import ADAPTER_CONFIG, attach_adapter

    tf, d = _transformers(), Path(directory)
    attn = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        with _quiet():
            if (d / ADAPTER_CONFIG).is_file():  # posttrain's LoRA layout: base weights + adapter in one directory
                config = tf.AutoConfig.from_pretrained(str(d), local_files_only=True)
                model = tf.AutoModelForCausalLM.from_config(config, dtype=dtype, **attn)
                _load_base_weights(model, d)
            else:
                model = tf.AutoModelForCausalLM.from_pretrained(str(d), local_files_only=True, dtype=dtype, **attn)
    except UserError:
        raise
    except Exception as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{d}: cannot load the Hugging Face model ({msg})") from None
    if (d / ADAPTER_CONFIG).is_file():
        attach_adapter(model, d)
    return model


def check_vocab_fits(tokenizer, model: torch.nn.Module, directory: str | Path) -> None:
    """Refuse a tokenizer whose ids reach past the model's embedding rows (a tokenizer.json swapped or edited
    beside the weights): a one-line UserError at load, not an IndexError at the first forward pass.

    Example: a 17-row model with a 27-token tokenizer -> "DIR: the tokenizer has 27 token ids (0..26) but the
    model's vocabulary has 17 rows: ids 17 and up would index past its embedding table"."""
    rows = getattr(getattr(model, "config", None), "vocab_size", None)
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else getattr(model, "wte", None)
    if isinstance(getattr(embed, "num_embeddings", None), int):
        rows = embed.num_embeddings  # the table itself (a resized Hugging Face model keeps its config in step)
    if not isinstance(rows, int):
        return
    size = int(tokenizer.vocab_size)
    specials = {k: getattr(tokenizer, f"{k}_id", None) for k in ("pad", "bos", "eos")}
    top = max([size - 1] + [v for v in specials.values() if isinstance(v, int)])
    if top >= rows:
        raise UserError(
            f"{directory}: the tokenizer has token ids up to {top} but the model's vocabulary has {rows} rows: "
            f"ids {rows} and up would index past its embedding table (a tokenizer from another model?)"
        )


def _load_base_weights(model, d: Path) -> None:
    from safetensors.torch import load_model as st_load

    w = d / "model.safetensors"
    if not w.is_file():
        raise UserError(f"{d}: no model.safetensors (the base weights of the LoRA adapter)")
    missing, unexpected = st_load(model, str(w), strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) | {"lm_head.weight"}
    missing = [m for m in missing if m not in tied]
    if missing or unexpected:
        raise UserError(f"{w}: weights do not match config.json (missing {missing[:3]}, unexpected {unexpected[:3]})")
    model.tie_weights()


def save_hf_model(model, directory: str | Path) -> None:
    """transformers' layout (config.json, generation_config.json, model.safetensors); with LoRA the base weights
    and the adapter files (models/lora.py)."""
    from posttrain.models.lora import base_state_dict, has_lora, save_adapter

    d = Path(directory)
    lora = has_lora(model)
    sd = base_state_dict(model) if lora else None
    with _quiet():
        model.save_pretrained(str(d), state_dict=sd, max_shard_size="1000GB")
    if lora:
        save_adapter(model, d)


# ---------------------------------------------------------------------------------------------
# exporting posttrain's own tokenizers


def char_tokenizer_json(tok) -> dict:
    """posttrain's char tokenizer as a ``tokenizers`` file: one WordLevel token per character (a Split on every
    character, a Fuse decoder), the specials as added tokens, so ``PreTrainedTokenizerFast`` encodes the same ids."""
    vocab = {tok.id_to_token(i): i for i in range(tok.vocab_size)}
    specials = [
        {
            "id": i,
            "content": tok.id_to_token(i),
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i in (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id)
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": specials,
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": tok.id_to_token(tok.unk_id)},
    }


def save_tokenizer_for_transformers(tok, directory: str | Path, model_max_length: int | None = None) -> None:
    """Write ``tok`` so that ``AutoTokenizer.from_pretrained(directory)`` loads it: a model directory's tokenizer
    as it was; posttrain's subword tokenizers as their tokenizer.json + a tokenizer_config.json naming the
    special tokens (class PreTrainedTokenizerFast); the char tokenizer as a WordLevel tokenizer.json."""
    d = Path(directory)
    if isinstance(tok, ModelTokenizer):
        return tok.save(d)
    from posttrain.tokenizers.char import CharTokenizer

    if isinstance(tok, CharTokenizer):
        (d / "tokenizer.json").write_text(json.dumps(char_tokenizer_json(tok), ensure_ascii=False))
    else:
        tok.save(d / "tokenizer.json")
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False}
    for role in ("pad", "bos", "eos", "unk"):
        i = getattr(tok, f"{role}_id", None)
        if i is not None:
            cfg[f"{role}_token"] = tok.id_to_token(i)
    if model_max_length:
        cfg["model_max_length"] = model_max_length
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
