"""Sampling throughput: our batched KV-cache sampler vs Hugging Face ``generate``, side by side.

Same size and shape on both sides (4 layers, width 128, 4 heads, vocab 32, tied embeddings): our GPT
and a randomly initialised HF GPT-2. Batch: 64 prompts x 8 samples, 16 new tokens, temperature 1,
EOS disabled so every row generates exactly 16 tokens. A third row drives the HF model with our
sampler, separating sampler overhead from model speed.

    .venv/bin/python benchmarks/bench_sampling.py [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse

import torch
from _util import median_time, print_table

from posttrain.generate import SamplingConfig, generate
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
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    V = 32
    ours = GPT(GPTConfig(vocab_size=V, n_layer=4, n_head=4, d_model=128, max_seq_len=64)).eval()
    hf = hf_model_from_config(
        tiny_hf_config("gpt2", vocab_size=V, n_layer=4, n_head=4, d_model=128, max_seq_len=64)
    ).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [
        [1] + torch.randint(4, V, (int(n),), generator=g).tolist()
        for n in torch.randint(3, 8, (args.prompts,), generator=g)
    ]
    n_tokens = args.prompts * args.samples * args.new_tokens
    cfg = SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0, num_samples=args.samples)

    def run_ours(model):
        return lambda: generate(
            model, prompts, pad_id=0, eos_id=None, cfg=cfg, generator=torch.Generator().manual_seed(1)
        )

    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
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
                min_new_tokens=args.new_tokens,
                pad_token_id=0,
                eos_token_id=None,
            )

    out = run_hf()
    assert out.shape == (args.prompts * args.samples, width + args.new_tokens), out.shape
    results = {}
    for name, fn in [
        ("posttrain sampler + posttrain GPT", run_ours(ours)),
        ("HF generate + HF GPT-2", run_hf),
        ("posttrain sampler + HF GPT-2", run_ours(hf)),
    ]:
        med, _ = median_time(fn, repeats=args.repeats, clock=args.clock)
        results[name] = med
    base = results["HF generate + HF GPT-2"]
    print(
        f"\nsampling: {args.prompts} prompts x {args.samples} samples x {args.new_tokens} new tokens, "
        f"{args.threads} threads, median {args.clock} time of {args.repeats}"
    )
    print_table(
        ["side", "median s", "tokens/s", "vs HF generate"],
        [[k, v, n_tokens / v, f"{base / v:.2f}x"] for k, v in results.items()],
    )


if __name__ == "__main__":
    main()
