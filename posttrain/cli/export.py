"""``posttrain export CKPT --format hf --out DIR``: a checkpoint as a Hugging Face model directory.

posttrain's GPT becomes a GPT-2 directory (``models/convert.py`` maps the weights exactly) with its tokenizer
written for transformers (``models/loading.py``: subword tokenizers as tokenizer.json + tokenizer_config.json,
the char tokenizer as a WordLevel tokenizer.json); a Hugging Face model is written in its own layout. With
``--merge-lora`` the LoRA adapters are merged into full weights (needed for a GPT trained with LoRA, whose
adapter names have no GPT-2 equivalent). The result loads with ``AutoModelForCausalLM.from_pretrained(DIR)``
and ``AutoTokenizer.from_pretrained(DIR)``, whose ``chat_template`` is the template the model was trained with
(``chat_template.jinja`` of the checkpoint, written as ``chat_template.jinja`` and into ``tokenizer_config.json``).

A sharded checkpoint (``--fsdp``: a ``dcp/`` directory of per-rank shards, for resuming only) is consolidated by
this one process, with no process group (``trainers/sharded.consolidate``): by default into a plain posttrain
checkpoint (one ``model.safetensors`` with the tokenizer and state: what ``--init`` and ``eval`` read),
or with ``--format hf`` into the Hugging Face layout as above. ``--format safetensors`` writes the plain
checkpoint for any input (LoRA merged with ``--merge-lora``).

A diverged model (a NaN/Inf weight, or finite weights whose forward pass gives NaN/Inf logits) is refused with one
line (:func:`posttrain.trainers.checkpoint.refuse_nonfinite_model`): nothing is written.
"""

from __future__ import annotations

from pathlib import Path

NAME = "export"
HELP = (
    "export a checkpoint as a Hugging Face model directory (GPT -> GPT-2; --merge-lora merges adapters), or "
    "consolidate a sharded (--fsdp, DCP) checkpoint into one model.safetensors"
)


def add_arguments(p):
    p.add_argument(
        "checkpoint", help="checkpoint directory, run directory (its model/) or Hugging Face model directory"
    )
    p.add_argument(
        "--format",
        choices=("hf", "safetensors"),
        default=None,
        help="output format: hf (transformers' save_pretrained layout; the default for a plain checkpoint) | "
        "safetensors (a plain posttrain checkpoint, one model.safetensors; the default for a sharded "
        "--fsdp checkpoint)",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="directory to write (new or empty)")
    p.add_argument("--merge-lora", action="store_true", help="merge LoRA adapters into the weights (no adapter files)")


def run(args) -> int:
    from posttrain.checkpoints.load import load_policy
    from posttrain.errors import UserError
    from posttrain.trainers.checkpoint import refuse_nonfinite_model
    from posttrain.trainers.sharded import is_sharded_checkpoint

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out} exists and is not an empty directory")
    if is_sharded_checkpoint(args.checkpoint):
        return _export_sharded(args, out)
    rm_dir = _reward_model_dir(args.checkpoint)
    if rm_dir is not None:
        return _export_reward_model(rm_dir, out, args)
    ckpt = load_policy(args.checkpoint, role="export")
    refuse_nonfinite_model(ckpt.model, ckpt.path, "export")  # a diverged model (NaN/Inf weights or logits)
    if args.format == "safetensors":
        return _export_plain(ckpt, out, args.merge_lora)
    return _export_hf(ckpt, out, args.merge_lora)


def _export_hf(ckpt, out: Path, merge: bool) -> int:
    from posttrain.data.io import atomic_dir
    from posttrain.errors import UserError
    from posttrain.models.convert import gpt_to_hf_gpt2
    from posttrain.models.gpt import GPT
    from posttrain.models.loading import save_hf_model, save_tokenizer_for_transformers
    from posttrain.models.lora import has_lora, merge_lora

    model, tok = ckpt.model, ckpt.tokenizer
    if merge:
        if not has_lora(model):
            raise UserError(f"--merge-lora: {ckpt.path} has no LoRA adapter")
        model = merge_lora(model)
    if isinstance(model, GPT):
        if has_lora(model):
            raise UserError(
                f"{ckpt.path} holds a LoRA adapter on posttrain's GPT: pass --merge-lora (GPT-2 has no "
                f"names for its adapted layers)"
            )
        model = gpt_to_hf_gpt2(model, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    model.eval()
    with atomic_dir(out) as tmp:
        save_hf_model(model, tmp)
        save_tokenizer_for_transformers(
            tok,
            tmp,
            model_max_length=getattr(model.config, "n_positions", None)
            or getattr(model.config, "max_position_embeddings", None),
        )
        copy_chat_template(ckpt.path, tmp)
    kind = "base + LoRA adapter" if has_lora(model) else "full weights"
    print(
        f"exported {ckpt.path} -> {out} ({model.config.model_type}, {kind}); load it with "
        f"AutoModelForCausalLM.from_pretrained({str(out)!r})"
    )
    return 0


def _export_plain(ckpt, out: Path, merge: bool) -> int:
    from posttrain.errors import UserError
    from posttrain.models.lora import has_lora, merge_lora
    from posttrain.trainers.checkpoint import save_checkpoint

    model = ckpt.model
    if merge:
        if not has_lora(model):
            raise UserError(f"--merge-lora: {ckpt.path} has no LoRA adapter")
        model = merge_lora(model)
    state = {k: v for k, v in (ckpt.state or {}).items()}
    save_checkpoint(out, model=model, tokenizer=ckpt.tokenizer, state={**state, "exported_from": str(ckpt.path)})
    copy_chat_template(ckpt.path, out)
    print(f"exported {ckpt.path} -> {out} (plain checkpoint: {out / 'model.safetensors'})")
    return 0


def _reward_model_dir(path) -> Path | None:
    """The checkpoint ``path`` names when it is a ``posttrain rm`` one (it has ``reward_head.safetensors``)."""
    from posttrain.checkpoints.layout import REWARD_HEAD_FILE, find_checkpoint
    from posttrain.errors import UserError

    try:
        p = find_checkpoint(path)
    except UserError:
        return None
    return p if (p / REWARD_HEAD_FILE).is_file() else None


def _export_reward_model(path: Path, out: Path, args) -> int:
    """A reward model in transformers' sequence-classification layout (``score.weight``; models/seq_cls.py)."""
    from posttrain.data.io import atomic_dir
    from posttrain.errors import UserError
    from posttrain.models.convert import gpt_to_hf_gpt2
    from posttrain.models.gpt import GPT
    from posttrain.models.loading import save_hf_model, save_tokenizer_for_transformers
    from posttrain.models.lora import has_lora, merge_lora
    from posttrain.models.seq_cls import to_sequence_classification
    from posttrain.rewards.reward_model import load_reward_model
    from posttrain.trainers.checkpoint import refuse_nonfinite_model

    if args.format == "safetensors":
        raise UserError(f"{path} is a reward model: it exports in the Hugging Face layout only (drop --format)")
    loaded = load_reward_model(path)
    backbone, tok = loaded.model.backbone.model, loaded.tokenizer
    refuse_nonfinite_model(backbone, path, "export")
    if has_lora(backbone):
        if not args.merge_lora:
            raise UserError(f"{path} holds a LoRA adapter: pass --merge-lora (the classification layout has none)")
        backbone = merge_lora(backbone)
    if isinstance(backbone, GPT):
        backbone = gpt_to_hf_gpt2(backbone, pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    if tok.pad_id is not None and tok.pad_id == tok.eos_id:
        print(
            "warning: the pad token is the EOS token: transformers finds the last real token as the last non-pad "
            "one, so it scores completions at the token before their EOS (posttrain scores the EOS)"
        )
    head = loaded.model.head.proj
    stats = {"mean": loaded.stats.mean, "std": loaded.stats.std} if loaded.stats is not None else {}
    model = to_sequence_classification(backbone, head.weight, tok.pad_id, {"bias": float(head.bias), **stats})
    with atomic_dir(out) as tmp:
        save_hf_model(model, tmp)
        save_tokenizer_for_transformers(
            tok,
            tmp,
            model_max_length=getattr(model.config, "n_positions", None)
            or getattr(model.config, "max_position_embeddings", None),
        )
        copy_chat_template(path, tmp)
    print(
        f"exported reward model {path} -> {out} ({type(model).__name__}, score.weight from the reward head); load "
        f"it with AutoModelForSequenceClassification.from_pretrained({str(out)!r})"
    )
    return 0


def copy_chat_template(src, dst: Path) -> None:
    """The chat template the model was trained with (``chat_template.jinja`` or ``tokenizer_config.json`` in
    ``src``) written where transformers reads it: ``chat_template.jinja`` and the ``chat_template`` of
    ``tokenizer_config.json`` (created if absent), so ``AutoTokenizer.from_pretrained(dst).chat_template`` is it."""
    import json

    from posttrain.chat import template_in_dir

    found = template_in_dir(src)
    if found is None:
        return
    source = found[0]
    (dst / "chat_template.jinja").write_text(source, encoding="utf-8")
    cfg_path = dst / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8")) if cfg_path.is_file() else {}
    cfg["chat_template"] = source
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _export_sharded(args, out: Path) -> int:
    """A DCP checkpoint consolidated by this process: plain (default) or, through a temporary plain one, HF."""
    import tempfile

    from posttrain.checkpoints.load import load_policy
    from posttrain.errors import UserError
    from posttrain.trainers.sharded import consolidate

    if args.merge_lora:
        raise UserError(
            f"--merge-lora: {args.checkpoint} is a sharded checkpoint, and LoRA is not trained under --fsdp"
        )
    if args.format in (None, "safetensors"):
        consolidate(args.checkpoint, out)
        print(f"consolidated {args.checkpoint} -> {out} (one model.safetensors; the shards stay for resuming)")
        return 0
    with tempfile.TemporaryDirectory(prefix="posttrain-export-") as tmp:
        plain = consolidate(args.checkpoint, Path(tmp) / "plain")
        return _export_hf(load_policy(plain, role="export"), out, merge=False)
