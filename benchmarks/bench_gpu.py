"""posttrain against TRL on one GPU, the same model shapes, batches and precision: SFT, DPO and GRPO steps.

What each row measures (bf16 autocast with fp32 weights and AdamW on both sides; random-init models, random token
data, so nothing is downloaded; ``warmup`` steps are run first and not timed; CUDA is synchronised around the
timed steps; peak memory is ``torch.cuda.max_memory_allocated`` after a reset):

- ``sft/gpt2-small``: a GPT-2-small-shaped model (124M, V=50257, L=12, H=12, d=768) at sequence 1024. posttrain:
  its GPT placed by ``trainers/engine/device.py`` with ``sft_loss``, ``make_optimizer`` and ``grad_norm_and_clip``,
  the calls ``posttrain sft`` makes per step (no data pipeline). TRL: ``SFTTrainer`` on Hugging Face's GPT-2 of
  the same shape. Tokens/s, MFU (``device.flops_per_token`` over ``device.peak_flops``) and peak memory.
- ``sft/qwen2-0.5b``: the same, a Qwen2-0.5B-shaped Hugging Face model (494M) on both sides.
- ``dpo``: DPO steps (pairs of prompt 256 + completion 256 tokens): posttrain's ``dpo_loss`` over
  ``scoring.completion_logps`` of the policy and of a frozen bf16 reference; TRL's ``DPOTrainer``. Step time.
- ``grpo``: GRPO steps of 64 prompts x 8 samples x 128 new tokens (prompt 64 tokens, no vLLM, one update per
  rollout, constant-seeded random rewards computed on the CPU): posttrain's ``generate`` (KV cache on the device),
  ``grpo_advantages``, ``policy_loss``; TRL's ``GRPOTrainer``. Step time and rollout tokens/s.

    python benchmarks/bench_gpu.py --out OUTDIR [--parts sft,dpo,grpo] [--trl] [--dry-run]

``--dry-run`` runs every part on tiny shapes on the CPU in fp32 (a check of the code, not a measurement). It writes
``OUTDIR/gpu_check.json`` (one record per row, with the machine, torch and TRL versions) and ``OUTDIR/gpu_check.md``
(a side-by-side table). Not handled: multi-GPU, vLLM, TRL's Liger kernels, compile on the TRL side.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import tempfile
import time
from pathlib import Path

import torch

from posttrain.generate import SamplingConfig, generate
from posttrain.losses.advantages import grpo_advantages
from posttrain.losses.policy import policy_loss
from posttrain.losses.preference.margin import dpo_loss
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.scoring import completion_logps
from posttrain.trainers import common
from posttrain.trainers.engine import device as D
from posttrain.trainers.guards import finite_step
from posttrain.trainers.sft import sft_loss

SHAPES = {  # name -> (kind, vocab, layers, heads, kv heads, width, MLP width, sequence)
    "gpt2-small": ("gpt2", 50257, 12, 12, 12, 768, 3072, 1024),
    "qwen2-0.5b": ("qwen2", 151936, 24, 14, 2, 896, 4864, 1024),
    "tiny-gpt2": ("gpt2", 97, 2, 2, 2, 32, 128, 64),
    "tiny-qwen2": ("qwen2", 97, 2, 2, 1, 32, 64, 64),
}
FULL = {"sft_batch": 16, "dpo_pairs": 8, "dpo_len": 256, "prompts": 64, "samples": 8, "new_tokens": 128, "plen": 64}
TINY = {"sft_batch": 2, "dpo_pairs": 2, "dpo_len": 8, "prompts": 2, "samples": 2, "new_tokens": 4, "plen": 4}


# ---------------------------------------------------------------------------------------------
# models and data


BUILD_ON = torch.device("cpu")  # models are built directly on the benchmark's device (main() sets it): fast init


def posttrain_gpt(shape: str) -> GPT:
    _, V, L, H, _, d, _, T = SHAPES[shape]
    with BUILD_ON:
        return GPT(GPTConfig(vocab_size=V, n_layer=L, n_head=H, d_model=d, max_seq_len=T, attn_backend="sdpa"))


def hf_model(shape: str):
    import transformers as tf

    kind, V, L, H, KV, d, F, T = SHAPES[shape]
    if kind == "gpt2":
        cfg = tf.GPT2Config(
            vocab_size=V, n_layer=L, n_head=H, n_embd=d, n_positions=T, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
        )
    else:
        cfg = tf.Qwen2Config(
            vocab_size=V,
            num_hidden_layers=L,
            num_attention_heads=H,
            num_key_value_heads=KV,
            hidden_size=d,
            intermediate_size=F,
            max_position_embeddings=T,
            tie_word_embeddings=True,
        )
    cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = 0, 1, 2
    with BUILD_ON:
        return tf.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")


def word_tokenizer(vocab: int):
    """A tokenizer for TRL over the words t0..t{V-1} (t0 pad, t1 BOS, t2 EOS): token i <-> word ti, so both sides
    see the same ids for the same text."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t3"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", bos_token="t1", eos_token="t2", unk_token="t3")


def words(ids) -> str:
    return " ".join(f"t{int(i)}" for i in ids)


def random_ids(n: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (n, length), generator=g)  # (n, length) no special tokens


# ---------------------------------------------------------------------------------------------
# timing


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def reset_memory(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)


def peak_gb(dev: torch.device) -> float | None:
    mem, kind = D.peak_memory(dev)
    return mem / 2**30 if kind == "cuda_max_allocated" else None  # the CPU's RSS is the whole process's: not a row's


def timed(step, dev: torch.device, warmup: int, steps: int) -> float:
    """Median seconds of ``step()`` over ``steps`` calls after ``warmup`` (CUDA synchronised around each)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        sync(dev)
        t0 = time.perf_counter()
        step()
        sync(dev)
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def mfu(model, shape: str, tokens_per_s: float, dev: torch.device, dtype: str) -> float | None:
    peak = D.peak_flops(dev, dtype)
    T = SHAPES[shape][-1]
    per_token = D.flops_per_token(D.matmul_params(model), *D.flop_shape(model), T)
    return None if peak is None else per_token * tokens_per_s / peak


# ---------------------------------------------------------------------------------------------
# posttrain side


def posttrain_sft(shape: str, hf: bool, a, rd: D.RunDevice) -> dict:
    torch.manual_seed(0)
    model = hf_model(shape) if hf else posttrain_gpt(shape)
    D.activate(rd)
    model = D.place(model, rd)
    model.train()
    opt = common.make_optimizer(model, 1e-4, 0.1)
    V, T, B = SHAPES[shape][1], SHAPES[shape][-1], a.size["sft_batch"]
    ids = random_ids(B, T + 1, V, 0).to(rd.device)  # (B, T + 1): T positions through the model
    mask = torch.ones_like(ids)
    mask[:, 0] = 0
    n_tok = int(mask[:, 1:].sum())

    def step():
        loss = sft_loss(model, ids, mask, n_tok)
        loss.backward()
        finite_step(opt, loss.item(), common.grad_norm_and_clip(model, 1.0))

    reset_memory(rd.device)
    sec = timed(step, rd.device, a.warmup, a.steps)
    tps = B * T / sec
    D.activate(None)
    return {"step_s": sec, "tokens_per_s": tps, "mfu": mfu(model, shape, tps, rd.device, rd.dtype)} | {
        "peak_memory_gb": peak_gb(rd.device)
    }


def posttrain_dpo(shape: str, a, rd: D.RunDevice) -> dict:
    torch.manual_seed(0)
    D.activate(rd)
    policy = posttrain_gpt(shape)
    ref = common.frozen(posttrain_gpt(shape))  # on the device in the compute dtype (engine/device.py)
    ref.load_state_dict(policy.state_dict())
    policy = D.place(policy, rd)
    policy.train()
    opt = common.make_optimizer(policy, 1e-6, 0.0)
    V, B, n = SHAPES[shape][1], a.size["dpo_pairs"], a.size["dpo_len"]
    ids = random_ids(2 * B, 2 * n, V, 1).to(rd.device)  # (2B, P + C): chosen rows, then rejected
    attn = torch.ones_like(ids)

    def step():
        lp = completion_logps(policy, ids, attn, n).sum(-1)  # (2B,)
        with torch.no_grad():
            rlp = completion_logps(ref, ids, attn, n).sum(-1).float()
        loss, _ = dpo_loss(
            policy_chosen_logps=lp[:B],
            policy_rejected_logps=lp[B:],
            ref_chosen_logps=rlp[:B],
            ref_rejected_logps=rlp[B:],
            beta=0.1,
        )
        loss.backward()
        finite_step(opt, loss.item(), common.grad_norm_and_clip(policy, 1.0))

    reset_memory(rd.device)
    sec = timed(step, rd.device, a.warmup, a.steps)
    D.activate(None)
    return {"step_s": sec, "tokens_per_s": 2 * B * 2 * n / sec, "peak_memory_gb": peak_gb(rd.device)}


def posttrain_grpo(shape: str, a, rd: D.RunDevice) -> dict:
    torch.manual_seed(0)
    D.activate(rd)
    model = D.place(posttrain_gpt(shape), rd)
    opt = common.make_optimizer(model, 1e-6, 0.0)
    V, s = SHAPES[shape][1], a.size
    prompts = random_ids(s["prompts"], s["plen"], V, 2).tolist()
    sampling = SamplingConfig(max_new_tokens=s["new_tokens"], num_samples=s["samples"])
    g = torch.Generator(device=rd.device).manual_seed(0)
    made = {"tokens": 0, "rollout_s": 0.0}

    def step():
        sync(rd.device)
        t0 = time.perf_counter()
        gen = generate(model, prompts, pad_id=0, eos_id=2, cfg=sampling, generator=g)
        sync(rd.device)
        made["rollout_s"] += time.perf_counter() - t0
        made["tokens"] += int(gen.completion_mask.sum())
        rewards = torch.rand(gen.sequences.shape[0], generator=torch.Generator().manual_seed(made["tokens"]))  # CPU
        adv = grpo_advantages(rewards, s["samples"])[0].to(rd.device)  # (N,)
        model.train()
        total = 0.0
        for rows in torch.arange(len(adv)).split(s["prompts"]):  # micro-batches of 64 rows, one optimizer step
            lp = completion_logps(model, gen.sequences[rows], gen.attention_mask[rows], gen.prompt_length)  # (n, C)
            loss, _ = policy_loss(lp, gen.logps[rows], adv[rows], gen.completion_mask[rows])
            (loss / s["samples"]).backward()
            total += loss.item() / s["samples"]
        finite_step(opt, total, common.grad_norm_and_clip(model, 1.0))

    reset_memory(rd.device)
    sec = timed(step, rd.device, a.warmup, a.steps)
    D.activate(None)
    return {
        "step_s": sec,
        "rollout_tokens_per_s": made["tokens"] / max(made["rollout_s"], 1e-9),
        "peak_memory_gb": peak_gb(rd.device),
    }


# ---------------------------------------------------------------------------------------------
# TRL side


class _StepTimes:
    """A transformers TrainerCallback: wall time of each optimizer step (CUDA synchronised)."""

    def __init__(self, dev: torch.device):
        from transformers import TrainerCallback

        self.dev, self.times, self._t0 = dev, [], 0.0
        outer = self

        class CB(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                sync(outer.dev)
                outer._t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                sync(outer.dev)
                outer.times.append(time.perf_counter() - outer._t0)

        self.callback = CB()

    def median(self, warmup: int) -> float:
        t = sorted(self.times[warmup:])
        return t[len(t) // 2]


def _trl_args(cls, a, out: str, **kw):
    return cls(
        output_dir=out,
        max_steps=a.warmup + a.steps,
        learning_rate=1e-6,
        bf16=a.dtype == "bf16",
        logging_steps=10**6,
        save_strategy="no",
        report_to=[],
        use_cpu=a.device == "cpu",
        dataloader_num_workers=0,
        seed=0,
        **kw,
    )


def trl_sft(shape: str, a, dev: torch.device) -> dict:
    import datasets
    import trl

    torch.manual_seed(0)
    V, T, B = SHAPES[shape][1], SHAPES[shape][-1], a.size["sft_batch"]
    ids = random_ids(B * (a.warmup + a.steps), T, V, 0)  # T positions through the model, as posttrain's T + 1 ids
    data = datasets.Dataset.from_dict({"input_ids": ids.tolist()})
    timer = _StepTimes(dev)
    with tempfile.TemporaryDirectory() as out:
        args = _trl_args(trl.SFTConfig, a, out, per_device_train_batch_size=B, max_length=T, packing=False)
        model = hf_model(shape)
        tr = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=word_tokenizer(V))
        tr.add_callback(timer.callback)
        reset_memory(dev)
        tr.train()
    sec = timer.median(a.warmup)
    tps = B * T / sec
    return {"step_s": sec, "tokens_per_s": tps, "mfu": mfu(model, shape, tps, dev, a.dtype)} | {
        "peak_memory_gb": peak_gb(dev)
    }


def trl_dpo(shape: str, a, dev: torch.device) -> dict:
    import datasets
    import trl

    torch.manual_seed(0)
    V, B, n = SHAPES[shape][1], a.size["dpo_pairs"], a.size["dpo_len"]
    rows = random_ids(2 * B * (a.warmup + a.steps), 2 * n, V, 1)
    half = len(rows) // 2
    data = datasets.Dataset.from_dict(
        {
            "prompt": [words(r[:n]) for r in rows[:half]],
            "chosen": [" " + words(r[n:]) for r in rows[:half]],
            "rejected": [" " + words(r[n:]) for r in rows[half:]],
        }
    )
    timer = _StepTimes(dev)
    with tempfile.TemporaryDirectory() as out:
        args = _trl_args(trl.DPOConfig, a, out, per_device_train_batch_size=B, max_length=2 * n + 2, beta=0.1)
        model, ref = hf_model(shape), hf_model(shape)
        ref.load_state_dict(model.state_dict())
        tr = trl.DPOTrainer(
            model=model, ref_model=ref, args=args, train_dataset=data, processing_class=word_tokenizer(V)
        )
        tr.add_callback(timer.callback)
        reset_memory(dev)
        tr.train()
    sec = timer.median(a.warmup)
    return {"step_s": sec, "tokens_per_s": 2 * B * 2 * n / sec, "peak_memory_gb": peak_gb(dev)}


def trl_grpo(shape: str, a, dev: torch.device) -> dict:
    import datasets
    import trl

    torch.manual_seed(0)
    V, s = SHAPES[shape][1], a.size
    prompts = random_ids(s["prompts"] * (a.warmup + a.steps), s["plen"], V, 2)
    data = datasets.Dataset.from_dict({"prompt": [words(p) for p in prompts]})

    def reward(completions, **kw):  # on the CPU, as posttrain's
        return torch.rand(len(completions)).tolist()

    timer = _StepTimes(dev)
    with tempfile.TemporaryDirectory() as out:
        args = _trl_args(
            trl.GRPOConfig,
            a,
            out,
            per_device_train_batch_size=s["prompts"],  # micro-batches of 64 rows, as posttrain's
            gradient_accumulation_steps=s["samples"],  # 8 of them: one optimizer step per 64 x 8 generation
            num_generations=s["samples"],
            max_completion_length=s["new_tokens"],
            beta=0.0,
            num_iterations=1,
            use_vllm=False,
        )
        tr = trl.GRPOTrainer(
            model=hf_model(shape),
            reward_funcs=reward,
            args=args,
            train_dataset=data,
            processing_class=word_tokenizer(V),
        )
        tr.add_callback(timer.callback)
        reset_memory(dev)
        tr.train()
    return {"step_s": timer.median(a.warmup), "peak_memory_gb": peak_gb(dev)}


# ---------------------------------------------------------------------------------------------
# the table


def rows_for(a, rd: D.RunDevice, on_row) -> list[dict]:
    small, qwen = ("tiny-gpt2", "tiny-qwen2") if a.dry_run else ("gpt2-small", "qwen2-0.5b")
    plan = []
    # in order of what the check must show first: a stage cut off by its time limit keeps the rows before
    if "sft" in a.parts:
        plan += [("sft", small, lambda: posttrain_sft(small, False, a, rd), lambda: trl_sft(small, a, rd.device))]
    if "grpo" in a.parts:
        plan += [("grpo", small, lambda: posttrain_grpo(small, a, rd), lambda: trl_grpo(small, a, rd.device))]
    if "dpo" in a.parts:
        plan += [("dpo", small, lambda: posttrain_dpo(small, a, rd), lambda: trl_dpo(small, a, rd.device))]
    if "sft" in a.parts:
        plan += [("sft", qwen, lambda: posttrain_sft(qwen, True, a, rd), lambda: trl_sft(qwen, a, rd.device))]
    out = []
    for task, shape, ours, theirs in plan:
        rec = {"task": task, "shape": shape, "posttrain": _guarded(ours)}
        if a.trl:
            rec["trl"] = _guarded(theirs)
        print(json.dumps(rec), flush=True)
        out.append(rec)
        on_row(out)  # written after every row: a stage cut off by its time limit keeps what it measured
    return out


def _guarded(fn) -> dict:
    """A row's figures, or the one-line error that stopped it (one failing row never hides the others)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded, not raised: the check reports every row
        D.activate(None)
        return {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"}


def table(rows: list[dict]) -> str:
    head = "| task | shape | metric | posttrain | TRL | posttrain / TRL |\n|---|---|---|---|---|---|\n"
    lines = []
    for r in rows:
        ours, theirs = r["posttrain"], r.get("trl", {})
        for k in ("tokens_per_s", "mfu", "step_s", "rollout_tokens_per_s", "peak_memory_gb", "error"):
            if k not in ours and k not in theirs:
                continue
            x, y = ours.get(k), theirs.get(k)
            ratio = f"{x / y:.2f}" if isinstance(x, float) and isinstance(y, float) and y else ""
            lines.append(f"| {r['task']} | {r['shape']} | {k} | {_fmt(x)} | {_fmt(y)} | {ratio} |")
    return head + "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if math.isfinite(v) else str(v)
    return str(v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for gpu_check.json and gpu_check.md")
    ap.add_argument("--parts", default="sft,dpo,grpo", help="comma-separated: sft, dpo, grpo")
    ap.add_argument("--trl", action="store_true", help="also run TRL's trainers on the same shapes and batches")
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    ap.add_argument("--dtype", default="bf16", choices=("fp32", "bf16"))
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (CUDA kernels, allocator, autotune)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps (median reported)")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on the CPU in fp32: checks the code only")
    a = ap.parse_args(argv)
    if a.dry_run:
        a.device, a.dtype, a.warmup, a.steps = "cpu", "fp32", 1, 2
    a.parts = set(a.parts.split(","))
    a.size = TINY if a.dry_run else FULL
    global BUILD_ON
    rd = D.RunDevice(D.resolve_device(a.device), a.dtype)
    BUILD_ON = rd.device
    a.device = rd.device.type
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    trl_version = None
    if a.trl:
        import trl

        trl_version = trl.__version__
    meta = {
        "device": torch.cuda.get_device_name(rd.device) if rd.device.type == "cuda" else platform.processor() or "cpu",
        "dtype": a.dtype,
        "torch": torch.__version__,
        "trl": trl_version,
        "dry_run": a.dry_run,
        "warmup": a.warmup,
        "steps": a.steps,
        "sizes": a.size,
    }

    def write(rows: list[dict]) -> str:
        (out / "gpu_check.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
        note = (
            "DRY RUN: tiny shapes on the CPU in fp32, a check of the code, not a measurement\n\n" if a.dry_run else ""
        )
        md = f"# GPU check: posttrain and TRL\n\n{note}{json.dumps(meta)}\n\n{table(rows)}"
        (out / "gpu_check.md").write_text(md)
        return md

    rows = rows_for(a, rd, write)
    print(write(rows))
    return 1 if any("error" in r["posttrain"] for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
