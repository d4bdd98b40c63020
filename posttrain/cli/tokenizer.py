"""``posttrain tokenizer train|encode|decode``: train a subword tokenizer, encode text to ids, decode back.

    posttrain tokenizer train --model byte-bpe --vocab-size 8000 --output tok.json corpus.txt
    posttrain tokenizer encode --tokenizer tok.json --ids < text.txt > ids.txt
    posttrain tokenizer decode --tokenizer tok.json < ids.txt

Inputs are plain text (one text per line) or JSONL with ``--text-field``; ``-`` or no input reads stdin.
``encode`` writes one line of space-separated ids (or tokens with ``--tokens``) per input line.
"""

from __future__ import annotations

import argparse
import sys

NAME = "tokenizer"
HELP = "train a BPE / byte-level BPE / WordPiece / Unigram tokenizer (tokenizer.json), encode and decode text"

MODELS = ("bpe", "byte-bpe", "wordpiece", "unigram")
# flag dest -> trainer field; a flag given for a model whose trainer lacks the field is an error
TRAIN_FLAGS = {
    "vocab_size": "vocab_size",
    "special_tokens": "special_tokens",
    "min_frequency": "min_frequency",
    "lowercase": "lowercase",
    "pattern": "pattern",
    "character_coverage": "character_coverage",
    "byte_fallback": "byte_fallback",
    "split_by_script": "split_by_script",
    "criterion": "criterion",
    "workers": "workers",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(title="actions", metavar="ACTION", dest="action")
    sub.required = True

    t = sub.add_parser(
        "train",
        help="train a tokenizer and write tokenizer.json",
        description="Train a tokenizer on text files and write a Hugging Face tokenizer.json.",
    )
    t.add_argument("inputs", nargs="*", metavar="INPUT", help="text or JSONL files ('-' or none: stdin)")
    t.add_argument("--model", required=True, choices=MODELS, help="subword model to train")
    t.add_argument("--vocab-size", type=int, required=True, help="vocabulary size including special tokens")
    t.add_argument("--output", "-o", required=True, help="tokenizer.json path to write")
    t.add_argument(
        "--special-tokens",
        nargs="+",
        default=None,
        metavar="TOK",
        help="special tokens (ids 0..k-1; never split). Default per model, e.g. <pad> <bos> <eos>",
    )
    t.add_argument("--text-field", default=None, help="read JSONL and take this field of each record")
    t.add_argument("--min-frequency", type=int, default=None, help="BPE/WordPiece: stop when the best pair is rarer")
    t.add_argument(
        "--lowercase",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="BPE/WordPiece: lower-case the text (WordPiece default: on)",
    )
    t.add_argument("--pattern", choices=("gpt2", "cl100k"), default=None, help="byte-bpe pre-tokeniser regex")
    t.add_argument(
        "--character-coverage",
        type=float,
        default=None,
        help="unigram: fraction of characters kept (rest -> byte fallback or <unk>; default 0.9995)",
    )
    t.add_argument(
        "--byte-fallback",
        action="store_true",
        default=None,
        help="bpe/unigram: unknown characters -> <0xNN> byte tokens instead of <unk>",
    )
    t.add_argument(
        "--split-by-script",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="unigram: a piece holds one Unicode script, digits and punctuation being their own "
        "(sentencepiece's default; default: on)",
    )
    t.add_argument(
        "--criterion",
        choices=("score", "likelihood"),
        default=None,
        help="wordpiece: merge by count(ab)/(count(a)count(b)) (default) or by the likelihood gain "
        "count(ab)*log(N count(ab)/(count(a)count(b))), which favours frequent pairs",
    )
    t.add_argument("--workers", type=int, default=None, help="processes for pre-tokenisation (default: all cores)")
    t.set_defaults(_action=_train)

    e = sub.add_parser("encode", help="text lines -> ids (or tokens)", description="Encode each input line.")
    e.add_argument("inputs", nargs="*", metavar="INPUT", help="text or JSONL files ('-' or none: stdin)")
    e.add_argument("--tokenizer", required=True, help="tokenizer.json (or a directory holding one)")
    g = e.add_mutually_exclusive_group()
    g.add_argument("--ids", dest="as_tokens", action="store_false", help="write token ids (default)")
    g.add_argument("--tokens", dest="as_tokens", action="store_true", help="write token strings")
    e.add_argument("--text-field", default=None, help="read JSONL and encode this field of each record")
    e.set_defaults(_action=_encode, as_tokens=False)

    d = sub.add_parser("decode", help="id lines -> text", description="Decode lines of space-separated ids.")
    d.add_argument("inputs", nargs="*", metavar="INPUT", help="files of id lines ('-' or none: stdin)")
    d.add_argument("--tokenizer", required=True, help="tokenizer.json (or a directory holding one)")
    d.add_argument("--keep-special", action="store_true", help="keep special tokens in the text")
    d.set_defaults(_action=_decode)


def run(args: argparse.Namespace) -> int:
    return args._action(args)


def _warn(msg: str) -> None:
    print(f"posttrain tokenizer: warning: {msg}", file=sys.stderr)


def _train(args) -> int:
    import dataclasses
    import time

    from posttrain.errors import UserError
    from posttrain.tokenizers import TRAINERS
    from posttrain.tokenizers.corpus import ReadReport, iter_texts, warn_report

    cls = TRAINERS[args.model]
    fields = {f.name for f in dataclasses.fields(cls)}
    kw = {}
    for dest, field in TRAIN_FLAGS.items():
        v = getattr(args, dest)
        if v is None:
            continue
        if field not in fields:
            raise UserError(f"--{dest.replace('_', '-')} does not apply to --model {args.model}")
        kw[field] = tuple(v) if dest == "special_tokens" else v
    if args.vocab_size <= 0:
        raise UserError(f"--vocab-size must be positive, got {args.vocab_size}")
    trainer = cls(**kw)
    report = ReadReport()
    texts = iter_texts(
        args.inputs or ["-"],
        text_field=args.text_field,
        keep_bytes=trainer.keep_bytes,
        report=report,
        keep_newlines=trainer.keep_newlines,
    )
    t0 = time.perf_counter()
    tok = trainer.train(_progress(texts, "reading"), log=lambda m: print(m, file=sys.stderr))
    warn_report(report, _warn, trainer.keep_bytes)
    tok.save(args.output)
    print(
        f"trained {args.model} tokenizer: vocab {tok.vocab_size} from {report.lines} lines "
        f"({report.chars / 1e6:.1f} M chars) in {time.perf_counter() - t0:.1f}s -> {args.output}"
    )
    return 0


def _progress(it, desc):
    from posttrain.progress import tqdm  # a bar on a terminal, plain lines in a log

    return tqdm(it, desc=desc, unit=" lines", file=sys.stderr, disable=None, mininterval=1.0)


def _encode(args) -> int:
    from posttrain.tokenizers import load
    from posttrain.tokenizers.corpus import ReadReport, iter_texts, warn_report

    tok = load(args.tokenizer)
    byte_level = getattr(tok, "kind", None) == "byte-bpe"
    report = ReadReport()
    out = sys.stdout
    itos = tok.id_to_token
    for text in _progress(
        iter_texts(args.inputs or ["-"], text_field=args.text_field, keep_bytes=byte_level, report=report), "encoding"
    ):
        ids = tok.encode_bytes(text.encode("utf-8", "surrogateescape")) if byte_level else tok.encode(text)
        out.write(" ".join(itos(i) for i in ids) if args.as_tokens else " ".join(map(str, ids)))
        out.write("\n")
    warn_report(report, _warn, byte_level)
    return 0


def _decode(args) -> int:
    from posttrain.errors import DataError
    from posttrain.tokenizers import load
    from posttrain.tokenizers.corpus import iter_texts

    tok = load(args.tokenizer)
    n = tok.vocab_size
    for line_no, line in enumerate(iter_texts(args.inputs or ["-"]), 1):
        try:
            ids = [int(x) for x in line.split()]
        except ValueError:
            raise DataError(
                f"decode input line {line_no}: expected space-separated integer ids, got {line[:40]!r}"
            ) from None
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise DataError(f"decode input line {line_no}: id {bad[0]} is outside the vocabulary (size {n})")
        sys.stdout.write(tok.decode(ids, skip_special_tokens=not args.keep_special) + "\n")
    return 0
