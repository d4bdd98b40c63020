"""``posttrain eval CHECKPOINT --data FILE.jsonl``: accuracy of a checkpoint on {prompt, answer} lines."""

from __future__ import annotations

from pathlib import Path

NAME = "eval"
HELP = "evaluate a checkpoint on a JSONL of {prompt, answer} by generation (greedy by default)"


def add_arguments(p):
    p.add_argument("checkpoint", help="checkpoint directory (or a run directory holding model/)")
    p.add_argument("--data", required=True, metavar="FILE.jsonl", help='lines {"prompt": ..., "answer": ...}')
    p.add_argument("--out", metavar="DIR", help="write summary.json (accuracy, n) and completions.jsonl here")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (default 0 = greedy)")
    p.add_argument("--max-new-tokens", type=int, default=8, help="tokens to generate per answer (default 8)")
    p.add_argument("--batch-size", type=int, default=256, help="prompts per generation batch (default 256)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed when temperature > 0")
    p.add_argument("--show", type=int, default=5, help="sample completions to print (default 5)")
    p.add_argument("--long", choices=("error", "truncate", "skip"), default="error",
                   help="prompts longer than max_seq_len - max_new_tokens: error (default), truncate (keep the "
                        "prompt's last tokens) or skip")


def run(args) -> int:
    import torch

    from posttrain.data.io import atomic_write_jsonl
    from posttrain.data.pairs import load_pairs
    from posttrain.errors import UserError
    from posttrain.evaluation import evaluate, fit_prompts, prompt_window
    from posttrain.generate import SamplingConfig
    from posttrain.text import printable
    from posttrain.trainers.checkpoint import POLICY, load_checkpoint
    from posttrain.trainers.common import write_summary

    SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)  # checks both (finite, bounds)
    if args.batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    pairs = load_pairs(args.data, "evaluation")
    ckpt = load_checkpoint(args.checkpoint, accept_kinds=POLICY, role="eval")
    gen = torch.Generator().manual_seed(args.seed)
    pairs = fit_prompts(ckpt.tokenizer, pairs, model=ckpt.model, max_new_tokens=args.max_new_tokens, long=args.long)
    r = evaluate(ckpt.model, ckpt.tokenizer, [p for p, _ in pairs], [a for _, a in pairs],
                 max_new_tokens=args.max_new_tokens, temperature=args.temperature, batch_size=args.batch_size,
                 generator=gen, keep_samples=len(pairs) if args.out else args.show,
                 max_prompt_tokens=prompt_window(ckpt.model, args.max_new_tokens))
    print(f"accuracy: {r.accuracy:.4f} ({r.correct}/{r.n}) on {args.data} with {ckpt.path}")
    for s in r.samples[: args.show]:
        verdict = "ok" if s["correct"] else f"want '{printable(s['answer'])}'"
        print(f"  '{printable(s['prompt'])}' -> '{printable(s['completion'])}'  {verdict}")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_jsonl(out / "completions.jsonl", r.samples)
        path = write_summary(out, {**r.summary(), "checkpoint": str(ckpt.path), "data": args.data,
                                   "temperature": args.temperature})
        print(f"summary: {path}")
    return 0
