"""Time per DPO optimizer step: posttrain's trainer step vs TRL's DPOTrainer, side by side in one run.

Same 0.8M-parameter model shape (4 layers, 4 heads, d_model 128, char vocabulary of the arithmetic
task), batch 16 pairs, the same (prompt, chosen, rejected) texts, AdamW, grad clipping 1.0, sigmoid
DPO loss with beta 0.1. Rows:

  trl DPOTrainer (HF GPT-2)           reference model forward every step (TRL's default)
  ours, HF GPT-2, live reference      our step (collate + policy/ref forward + loss + backward + AdamW) on the same HF model
  ours, GPT, live reference           the same on posttrain's GPT
  ours, GPT, precomputed reference    reference log-probs computed once for the dataset (--precompute-ref, the default)

Each step of ours includes tokenising and collating its batch, as TRL's includes its collator.
TRL's step time comes from a TrainerCallback (on_step_begin -> on_step_end). Medians over steps.

    .venv/bin/python benchmarks/bench_dpo.py --threads 1 --steps 30
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch
from _util import median_time, print_table

from posttrain.data.preference_pairs import synthetic_pairs
from posttrain.losses.preference import PREFERENCE_LOSSES
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.models.hf import hf_model_from_config, tiny_hf_config
from posttrain.tasks.arithmetic import ArithmeticConfig, ArithmeticTask
from posttrain.tokenizers.char import SPECIALS, CharTokenizer
from posttrain.trainers import common
from posttrain.trainers.common import frozen
from posttrain.trainers.dpo import DPOConfig
from posttrain.trainers.preference_data import PairedData

SHAPE = dict(n_layer=4, n_head=4, d_model=128)
BATCH, BETA, LR = 16, 0.1, 1e-4


def hf_tokenizer(alphabet: str):
    """A PreTrainedTokenizerFast with the same ids as CharTokenizer (pad 0, bos 1, eos 2, unk 3, then chars)."""
    from tokenizers import Tokenizer, pre_tokenizers
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(list(SPECIALS) + list(alphabet))}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )


def make_pairs(n: int):
    task = ArithmeticTask(ArithmeticConfig())
    problems = random.Random(0).sample(task.train_problems, n)
    return synthetic_pairs(problems, per_prompt=1, seed=0)


def time_trl(pairs, steps: int, clock: str):
    import datasets
    from transformers import TrainerCallback
    from trl import DPOConfig as TRLConfig
    from trl import DPOTrainer

    tok = hf_tokenizer(ArithmeticTask.alphabet)
    ds = datasets.Dataset.from_list([{"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected} for p in pairs])
    torch.manual_seed(0)
    model = hf_model_from_config(tiny_hf_config("gpt2", vocab_size=len(tok), **SHAPE))
    tick = time.process_time if clock == "cpu" else time.perf_counter
    times: list[float] = []

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = tick()

        def on_step_end(self, args, state, control, **kw):
            times.append(tick() - self.t0)

    args = TRLConfig(
        output_dir="/tmp/bench_dpo_trl",
        per_device_train_batch_size=BATCH,
        max_steps=steps + 2,
        learning_rate=LR,
        beta=BETA,
        loss_type=["sigmoid"],
        report_to="none",
        logging_strategy="no",
        save_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        max_grad_norm=1.0,
        disable_tqdm=True,
        seed=0,
    )
    ref = __import__("copy").deepcopy(model)  # TRL would reload it by name from the Hub otherwise
    trainer = DPOTrainer(
        model=model, ref_model=ref, args=args, train_dataset=ds, processing_class=tok, callbacks=[StepTimer()]
    )
    trainer.train()
    return statistics.median(times[2:])  # first steps warm up


def time_ours(model, pairs, steps: int, clock: str, precompute: bool):
    tok = CharTokenizer(ArithmeticTask.alphabet)
    cfg = DPOConfig(init="bench", loss="dpo", batch_size=BATCH)
    data = PairedData(pairs, tok, cfg)
    ref = frozen(__import__("copy").deepcopy(model))
    table = data.precompute(ref) if precompute else None
    ref_model = None if precompute else ref
    opt = common.make_optimizer(model, LR, 0.0)
    loss_fn = PREFERENCE_LOSSES["dpo"]
    model.train()
    state = {"step": 0}

    def step():
        s = state["step"]
        idx = list(range(s * BATCH % len(pairs), s * BATCH % len(pairs) + BATCH))
        state["step"] += 1
        batch = data.collate(idx)
        kw = data.loss_inputs(model, ref_model, batch, table[idx] if table is not None else None)
        loss, _ = loss_fn(**kw, beta=BETA)
        loss.backward()
        common.grad_norm_and_clip(model, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    med, _ = median_time(step, repeats=steps, warmup=2, clock=clock)
    return med


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="timed steps per row (median)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--clock", choices=("cpu", "wall", "both"), default="both")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pairs = make_pairs(BATCH * (args.steps + 4))
    vocab = len(SPECIALS) + len(ArithmeticTask.alphabet)
    clocks = ["cpu", "wall"] if args.clock == "both" else [args.clock]

    def hf():
        torch.manual_seed(0)
        return hf_model_from_config(tiny_hf_config("gpt2", vocab_size=vocab, **SHAPE))

    def gpt():
        torch.manual_seed(0)
        return GPT(GPTConfig(vocab_size=vocab, **SHAPE))

    results = {}
    for clock in clocks:
        results[("trl", clock)] = time_trl(pairs, args.steps, clock)
        results[("ours-hf", clock)] = time_ours(hf(), pairs, args.steps, clock, precompute=False)
        results[("ours-gpt", clock)] = time_ours(gpt(), pairs, args.steps, clock, precompute=False)
        results[("ours-gpt-pre", clock)] = time_ours(gpt(), pairs, args.steps, clock, precompute=True)
    names = {
        "trl": "trl DPOTrainer (HF GPT-2)",
        "ours-hf": "ours, HF GPT-2, live reference",
        "ours-gpt": "ours, GPT, live reference",
        "ours-gpt-pre": "ours, GPT, precomputed reference",
    }
    headers = ["implementation"] + [h for c in clocks for h in (f"ms/step ({c})", f"vs TRL ({c})")]
    rows = []
    for key, label in names.items():
        row = [label]
        for c in clocks:
            row += [1e3 * results[(key, c)], f"{results[(key, c)] / results[('trl', c)]:.2f}x"]
        rows.append(row)
    print(
        f"DPO step, batch {BATCH} pairs, 0.8M-param 4x128 model, threads {args.threads}, median of {args.steps} steps; "
        f"torch {torch.__version__}"
    )
    print_table(headers, rows)


if __name__ == "__main__":
    main()
