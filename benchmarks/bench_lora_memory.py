"""Peak RSS of DPO on a local Hugging Face model, full fine-tuning against LoRA (the reference as the adapters-off base).

Builds a random Qwen2 directory (``--hidden`` x ``--layers``, save_pretrained + a byte-level BPE tokenizer), then runs
``posttrain dpo --model DIR`` for a few steps in a fresh process per mode, with the reference model evaluated every step
(``--precompute-ref false``, so a full fine-tune holds a second copy of the weights) and prints each process's peak RSS
(``ru_maxrss``) beside that of a process that only loads the model:

    python benchmarks/bench_lora_memory.py --hidden 512 --layers 6
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import resource, sys, json
mode, d, data, out = sys.argv[1:5]
if mode == "load":
    from posttrain.checkpoints.load import load_policy
    load_policy(d)
else:
    from posttrain.trainers.dpo import DPOConfig, train_dpo
    train_dpo(DPOConfig(out=out, model_path=d, data=data, eval_data=data.replace("pairs", "evals"), steps=4, batch_size=8,
                        loss="dpo", precompute_ref=False, max_new_tokens=2, progress=False, eval_every=0, save_every=0,
                        lora_r=8 if mode == "lora" else 0))
print("PEAK_RSS_MB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def build(root: Path, hidden: int, layers: int) -> Path:
    import torch
    import transformers as tf

    from posttrain.tokenizers import ByteLevelBPETrainer

    d = root / "model"
    corpus = [f"{a}+{b}={a + b}" for a in range(50) for b in range(20)]
    tok = ByteLevelBPETrainer(vocab_size=400, special_tokens=("<|endoftext|>", "<|im_end|>"), workers=1).train(corpus)
    d.mkdir(parents=True)
    tok.save(d / "tokenizer.json")
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}))
    cfg = tf.Qwen2Config(
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        max_position_embeddings=64,
        vocab_size=tok.vocab_size,
        tie_word_embeddings=True,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg)
    model.save_pretrained(d)
    rows = [
        {"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)} for a in range(8) for b in range(8)
    ]
    (root / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "evals.jsonl").write_text(
        "".join(json.dumps({"prompt": r["prompt"], "answer": r["chosen"]}) + "\n" for r in rows[:4])
    )
    return d, sum(p.numel() for p in model.parameters())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench_lora_"))
    d, n = build(root, args.hidden, args.layers)
    print(f"Qwen2 {args.hidden} x {args.layers}: {n / 1e6:.1f}M params ({n * 4 / 2**20:.0f} MiB in fp32)")
    for mode in ("load", "full", "lora"):
        r = subprocess.run(
            [sys.executable, "-c", CHILD, mode, str(d), str(root / "pairs.jsonl"), str(root / mode)],
            capture_output=True,
            text=True,
        )
        peak = [ln for ln in r.stdout.splitlines() if ln.startswith("PEAK_RSS_MB")]
        if r.returncode or not peak:
            sys.exit(f"{mode} failed:\n{r.stderr[-2000:]}")
        print(f"{mode:>5}: peak RSS {float(peak[0].split()[1]):8.1f} MiB")


if __name__ == "__main__":
    main()
