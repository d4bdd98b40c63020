"""SFT training throughput: our GPT + our SFT loss vs the same-sized HF GPT-2 trained with a plain loop.

Both sides: 4 layers, width 128, 4 heads, vocab 32, tied embeddings (0.8M parameters), AdamW, batch
64 sequences of the embedded task ([BOS] prompt answer [EOS], completion-only loss), same data.
The HF side is the usual plain PyTorch loop: ``model(input_ids, labels=...)`` with -100 on prompt tokens.
A third row trains the HF model with our loss function, separating model speed from loop speed.

    .venv/bin/python benchmarks/bench_sft.py [--steps 30] [--repeats 5] [--threads 2] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse

import torch
from _util import median_time, print_table

from posttrain.data.batches import batch_indices
from posttrain.data.demos import encode_demos
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.models.hf import hf_model_from_config, tiny_hf_config
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tokenizers.char import CharTokenizer
from posttrain.trainers.sft import sft_loss


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    task = ArithmeticTask(ArithmeticConfig(num_demos=1024))
    tok = CharTokenizer(task.alphabet)
    ids, mask = encode_demos(tok, [(p.prompt, p.answer) for p in task.demonstrations()])
    labels = ids.masked_fill(mask == 0, -100)
    batches = [batch_indices(len(ids), args.batch_size, s, seed=0) for s in range(args.steps)]
    n_tokens = sum(int((ids[b] != tok.pad_id).sum()) for b in batches)

    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=tok.vocab_size, n_layer=4, n_head=4, d_model=128, max_seq_len=64))
    hf = hf_model_from_config(
        tiny_hf_config("gpt2", vocab_size=tok.vocab_size, n_layer=4, n_head=4, d_model=128, max_seq_len=64)
    )

    def loop_ours(model):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)

        def run():
            for b in batches:
                loss = sft_loss(model, ids[b], mask[b], int(mask[b][:, 1:].sum()))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

        return run

    def loop_hf_plain():
        opt = torch.optim.AdamW(hf.parameters(), lr=1e-3, foreach=True)

        def run():
            for b in batches:
                out = hf(input_ids=ids[b], attention_mask=(ids[b] != tok.pad_id).long(), labels=labels[b])
                out.loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

        return run

    results = {}
    for name, fn in [
        ("posttrain GPT + posttrain SFT step", loop_ours(ours)),
        ("HF GPT-2 + plain loop (labels=)", loop_hf_plain()),
        ("HF GPT-2 + posttrain SFT step", loop_ours(hf)),
    ]:
        med, _ = median_time(fn, repeats=args.repeats, clock=args.clock)
        results[name] = med
    base = results["HF GPT-2 + plain loop (labels=)"]
    print(
        f"\nSFT throughput: {args.steps} steps x batch {args.batch_size}, {n_tokens} tokens per repeat, "
        f"{args.threads} threads, median {args.clock} time of {args.repeats}"
    )
    print_table(
        ["side", "median s", "tokens/s", "vs HF plain loop"],
        [[k, v, n_tokens / v, f"{base / v:.2f}x"] for k, v in results.items()],
    )


if __name__ == "__main__":
    main()
