"""``posttrain eval CHECKPOINT [--data FILE.jsonl]``: accuracy of a checkpoint on {prompt, answer} lines.

Without ``--data`` the embedded task's held-out evaluation problems are used (the task the checkpoint was
trained on, from its saved config), as its trainer scored them: the whole held-out split (1,051 two-digit additions;
the default since 2026-12-03) or, where its ``task.num_eval`` was set (256 before that, and the pipeline's), that seeded
sample; ``--heldout all`` takes the whole split either way (half the sampling noise of 256); ``--heldout dev`` takes
the task's dev split instead (what a sweep chooses its recipe on; the held-out split is then only reported).
``--by-layout`` adds the accuracy per operand layout (``"2+2"``, ``"1+2"``, ...; sort's ``"4 digits"``, ...;
:func:`posttrain.tasks.embedded.layout`). ``--best-of N --reward-model RM`` adds best-of-N reranking: N samples per
prompt (temperature 1 unless ``--temperature`` says otherwise), the RM's favourite verified, reported beside
greedy accuracy and the oracle pass@N (:func:`posttrain.evaluation.best_of_n_evaluate`).
A diverged checkpoint (NaN/Inf weights or logits) is refused with one line; the ``--show`` examples print each
field cut to 200 characters (``evaluation.SHOW_CHARS``), however long the record.
"""

from __future__ import annotations

from pathlib import Path

NAME = "eval"
HELP = "evaluate a checkpoint on a JSONL of {prompt, answer} by generation (greedy by default; best-of-N with an RM)"


def add_arguments(p):
    from posttrain.evaluation import BEST_OF_RULES  # inside, as the other commands import their configs

    p.add_argument("checkpoint", help="checkpoint directory (or a run directory holding model/)")
    p.add_argument(
        "--data",
        metavar="FILE.jsonl",
        help='lines {"prompt": ..., "answer": ...} (default: the embedded '
        "task's held-out evaluation problems, as configured when the checkpoint was trained)",
    )
    p.add_argument(
        "--heldout",
        choices=("sample", "all", "dev"),
        default="sample",
        help="without --data: sample = the problems the checkpoint's trainer evaluated on (its task.num_eval: a "
        "seeded sample where that was set, else the whole held-out split); all = all of the held-out split; dev = "
        "the task's dev split (what choices are made on)",
    )
    p.add_argument(
        "--by-layout",
        action="store_true",
        help="also report accuracy per operand layout ('2+2', '1+2', ...: the operands' digit counts)",
    )
    p.add_argument("--out", metavar="DIR", help="write summary.json (accuracy, n) and completions.jsonl here")
    p.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="sampling temperature (default 0 = greedy; with --best-of the samples' temperature, default 1)",
    )
    p.add_argument("--max-new-tokens", type=int, default=8, help="tokens to generate per answer (default 8)")
    p.add_argument("--batch-size", type=int, default=256, help="prompts per generation batch (default 256)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed when temperature > 0")
    p.add_argument("--device", default="auto", help="auto (CUDA when present, else the CPU) | cpu | cuda | cuda:N")
    p.add_argument(
        "--dtype",
        default="fp32",
        choices=("fp32", "bf16", "fp16"),
        help="compute precision: the model's weights in it on the device, generation under autocast (default fp32)",
    )
    p.add_argument("--show", type=int, default=5, help="sample completions to print (default 5)")
    p.add_argument(
        "--long",
        choices=("error", "truncate", "skip"),
        default="error",
        help="prompts longer than max_seq_len - max_new_tokens: error (default), truncate (keep the "
        "prompt's last tokens) or skip",
    )
    p.add_argument(
        "--best-of",
        type=int,
        default=None,
        metavar="N",
        help="best-of-N: sample N completions per prompt "
        "and verify the one --reward-model scores highest (reported beside greedy accuracy and pass@N)",
    )
    p.add_argument("--reward-model", metavar="RM", help="a `posttrain rm` checkpoint that ranks the --best-of samples")
    p.add_argument(
        "--chat-template",
        default="auto",
        metavar="T",
        help="chat template for conversational prompts: auto (the model's own: its chat_template.jinja or "
        "tokenizer_config.json, as trained with) | tokenizer | chatml | none | a .jinja file",
    )
    p.add_argument(
        "--best-of-rule",
        choices=BEST_OF_RULES,
        default="max",
        help="max: the top-scored sample; weighted: the answer with the largest total softmax(score) over the samples "
        "that give it (best-of-N weighted, Snell et al. 2024), its top-scored sample",
    )


def _embedded(ckpt, heldout: str = "sample"):
    from posttrain.config import from_dict
    from posttrain.tasks.embedded import TaskConfig, embedded_task

    saved = (ckpt.state.get("config") or {}).get("task")
    task = embedded_task(from_dict(TaskConfig, saved) if isinstance(saved, dict) else TaskConfig())
    if heldout == "dev":
        problems = task.dev_set()
        return problems, f"all {len(problems)} of the embedded task's dev problems"
    if heldout == "all":
        problems = task.heldout_problems
        return [(p.prompt, p.answer) for p in problems], f"all {len(problems)} of the embedded task's held-out problems"
    return [(p.prompt, p.answer) for p in task.eval_problems()], "the embedded task's held-out problems"


def run(args) -> int:
    import torch

    from posttrain.chat import chat_tokenizer, resolve_chat
    from posttrain.checkpoints.load import POLICY, load_checkpoint
    from posttrain.data.io import atomic_write_jsonl
    from posttrain.data.pairs import load_pairs
    from posttrain.errors import UserError
    from posttrain.evaluation import SHOW_CHARS, accuracy_by, best_of_n_evaluate, evaluate, fit_prompts, prompt_window
    from posttrain.generate import SamplingConfig
    from posttrain.tasks.embedded import layout
    from posttrain.text import printable
    from posttrain.trainers.checkpoint import refuse_nonfinite_model
    from posttrain.trainers.common import write_summary
    from posttrain.trainers.engine import device

    best_of = args.best_of is not None
    if best_of != (args.reward_model is not None):
        raise UserError("--best-of N and --reward-model RM go together (the RM ranks the N samples)")
    if best_of and args.best_of < 1:
        raise UserError("--best-of must be >= 1")
    temperature = args.temperature if args.temperature is not None else (1.0 if best_of else 0.0)
    SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=temperature)  # checks both (finite, bounds)
    if best_of and temperature == 0:
        raise UserError("--best-of needs --temperature > 0: greedy samples are all identical")
    if args.batch_size < 1:
        raise UserError("--batch-size must be >= 1")
    if args.data and args.heldout != "sample":
        raise UserError(
            f"--heldout {args.heldout} chooses the embedded task's problems; with --data the file is the evaluation set"
        )
    where = device.resolve_device(args.device)  # --device cuda without CUDA: one line, exit 2
    ckpt = load_checkpoint(args.checkpoint, accept_kinds=POLICY, role="eval")
    refuse_nonfinite_model(ckpt.model, ckpt.path, "evaluate")  # NaN/Inf weights or logits: no accuracy to report
    device.place_frozen(ckpt.model, device.RunDevice(where, args.dtype))  # CPU fp32: the model as it is
    chat = resolve_chat(args.chat_template, ckpt.tokenizer, [ckpt.path])  # the template the model was trained with
    tok = chat_tokenizer(ckpt.tokenizer, chat)  # with a template, generation stops at its end-of-turn token
    pairs = load_pairs(args.data, "evaluation", chat=chat) if args.data else None
    scorer = None
    if best_of:
        from posttrain.rewards.reward_model import reward_model_reward

        scorer = reward_model_reward(rm_path=args.reward_model)  # loaded once; a policy here is a one-line error
    data_name = args.data
    if pairs is None:
        pairs, data_name = _embedded(ckpt, args.heldout)
    pairs = fit_prompts(tok, pairs, model=ckpt.model, max_new_tokens=args.max_new_tokens, long=args.long)
    prompts, answers = [p for p, _ in pairs], [a for _, a in pairs]
    window = prompt_window(ckpt.model, args.max_new_tokens)
    gen = torch.Generator().manual_seed(args.seed)
    r = evaluate(
        ckpt.model,
        tok,
        prompts,
        answers,
        max_new_tokens=args.max_new_tokens,
        temperature=0.0 if best_of else temperature,
        batch_size=args.batch_size,
        generator=gen,
        keep_samples=len(pairs) if args.out or args.by_layout else args.show,
        max_prompt_tokens=window,
    )
    label = "greedy accuracy" if best_of or temperature == 0 else "accuracy"
    print(f"{label}: {r.accuracy:.4f} ({r.correct}/{r.n}) on {data_name} with {ckpt.path}")
    for s in r.samples[: args.show]:  # each field cut to SHOW_CHARS: a 50 MB record prints as one short line
        verdict = "ok" if s["correct"] else f"want '{printable(s['answer'], SHOW_CHARS)}'"
        print(f"  '{printable(s['prompt'], SHOW_CHARS)}' -> '{printable(s['completion'], SHOW_CHARS)}'  {verdict}")
    summary = {**r.summary(), "checkpoint": str(ckpt.path), "data": data_name, "temperature": temperature}
    if args.by_layout:
        by = accuracy_by(r.samples, layout)
        print(
            "by operand layout:  "
            + "   ".join(f"{k} {v['accuracy']:.3f} ({v['correct']}/{v['n']})" for k, v in by.items())
        )
        summary["by_layout"] = by
    if best_of:
        b = best_of_n_evaluate(
            ckpt.model,
            tok,
            prompts,
            answers,
            scorer=scorer,
            num_samples=args.best_of,
            max_new_tokens=args.max_new_tokens,
            temperature=temperature,
            batch_size=args.batch_size,
            generator=gen,
            keep_samples=len(pairs) if args.out else 0,
            max_prompt_tokens=window,
            rule=args.best_of_rule,
        )
        rule = " (weighted)" if b.rule == "weighted" else ""
        print(
            f"best-of-{b.num_samples}{rule} with {args.reward_model}: {b.best_of_n_accuracy:.4f}   "
            f"pass@{b.num_samples} (oracle): {b.pass_at_n:.4f}   one sample (T={temperature:g}): "
            f"{b.sample_accuracy:.4f}   greedy: {r.accuracy:.4f}"
        )
        summary = {**summary, "greedy_accuracy": r.accuracy, **b.summary(), "reward_model": args.reward_model}
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_jsonl(out / "completions.jsonl", r.samples)
        if best_of:
            atomic_write_jsonl(out / "best_of_n.jsonl", b.samples)
        path = write_summary(out, summary)
        print(f"summary: {path}")
    return 0
