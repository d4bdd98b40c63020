"""Sampling throughput: our batched KV-cache sampler vs Hugging Face ``generate``, side by side.

Same size and shape on both sides (4 layers, width 128, 4 heads, vocab 32, tied embeddings): our GPT
and a randomly initialised HF GPT-2. Batch: 64 prompts x 8 samples, 16 new tokens, temperature 1,
EOS disabled so every row generates exactly 16 tokens. A third row drives the HF model with our
sampler, separating sampler overhead from model speed.

With ``--init SFT_DIR`` (a trained posttrain checkpoint, e.g. a pipeline run's ``sft/model``) the model is that
checkpoint (and its exact GPT-2 conversion for HF), the prompts are arithmetic problems in its tokenizer, and EOS is
on: rows end at different steps, as in RL. A fourth row runs our sampler with ``drop_finished=False`` (every row
to the last step, as HF does): what dropping finished rows from the forward passes saves. Another row draws the tokens
with ``torch.multinomial`` (the draw until 2026-12-03; an exponential per vocabulary entry) instead of the inverse CDF
(one uniform per row): what the draw costs.

    .venv/bin/python benchmarks/bench_sampling.py [--repeats 5] [--threads 2] [--init runs/demo/sft/model]
"""

from __future__ import annotations

import argparse

import torch
from _util import median_time, print_table

from posttrain.checkpoints.load import load_checkpoint
from posttrain.evaluation import encode_prompt
from posttrain.generate import SamplingConfig, generate
from posttrain.models.convert import gpt_to_hf_gpt2
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.models.hf import hf_model_from_config, tiny_hf_config


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument(
        "--clock",
        choices=("wall", "cpu"),
        default="wall",
        help="cpu = process CPU time (use on a busy machine, with --threads 1)",
    )
    ap.add_argument("--init", default=None, help="a trained posttrain checkpoint: its model, tokenizer and EOS")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    eos_id, pad_id = None, 0
    if args.init:
        ckpt = load_checkpoint(args.init)
        ours, tok = ckpt.model.eval(), ckpt.tokenizer
        eos_id, pad_id = tok.eos_id, tok.pad_id
        hf = gpt_to_hf_gpt2(ours, pad_id=pad_id, bos_id=tok.bos_id, eos_id=eos_id).eval()
        a, b = torch.randint(0, 100, (2, args.prompts), generator=g).tolist()
        prompts = [encode_prompt(tok, f"{x}+{y}=") for x, y in zip(a, b)]
    else:
        V = 32
        ours = GPT(GPTConfig(vocab_size=V, n_layer=4, n_head=4, d_model=128, max_seq_len=64)).eval()
        hf = hf_model_from_config(
            tiny_hf_config("gpt2", vocab_size=V, n_layer=4, n_head=4, d_model=128, max_seq_len=64)
        ).eval()
        prompts = [
            [1] + torch.randint(4, V, (int(n),), generator=g).tolist()
            for n in torch.randint(3, 8, (args.prompts,), generator=g)
        ]
    cfg = SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0, num_samples=args.samples)

    def run_ours(model, drop_finished=True, draw="inverse_cdf"):
        return lambda: generate(
            model,
            prompts,
            pad_id=pad_id,
            eos_id=eos_id,
            cfg=cfg,
            generator=torch.Generator().manual_seed(1),
            drop_finished=drop_finished,
            draw=draw,
        )

    gen = run_ours(ours)()
    n_tokens = int(gen.completion_mask.sum())  # tokens generated (EOS included) by our sampler on our model

    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = (torch.arange(width)[None] >= (width - torch.tensor([len(p) for p in prompts]))[:, None]).long()

    def run_hf():
        with torch.no_grad():
            return hf.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                num_return_sequences=args.samples,
                max_new_tokens=args.new_tokens,
                min_new_tokens=None if args.init else args.new_tokens,
                pad_token_id=pad_id,
                eos_token_id=eos_id,
            )

    out = run_hf()
    assert out.shape[0] == args.prompts * args.samples and out.shape[1] <= width + args.new_tokens, out.shape
    sides = [
        ("posttrain sampler + posttrain GPT", run_ours(ours)),
        ("HF generate + HF GPT-2", run_hf),
        ("posttrain sampler + HF GPT-2", run_ours(hf)),
    ]
    sides.insert(1, ("  the same, torch.multinomial draw (until 2026-12-03)", run_ours(ours, draw="multinomial")))
    if args.init:
        sides.insert(1, ("  the same, every row to the last step", run_ours(ours, drop_finished=False)))
    results = {}
    for name, fn in sides:
        med, _ = median_time(fn, repeats=args.repeats, clock=args.clock)
        results[name] = med
    base = results["HF generate + HF GPT-2"]
    what = (
        f"{args.init}, arithmetic prompts, EOS on ({n_tokens} tokens generated by ours, at most {args.new_tokens} "
        f"per row)"
        if args.init
        else f"{args.new_tokens} new tokens per row, EOS off"
    )
    print(
        f"\nsampling: {args.prompts} prompts x {args.samples} samples, {what}, {args.threads} threads, "
        f"median {args.clock} time of {args.repeats}"
    )
    print_table(
        ["side", "median s", "tokens/s", "vs HF generate"],
        [[k, v, n_tokens / v, f"{base / v:.2f}x"] for k, v in results.items()],
    )


if __name__ == "__main__":
    main()
