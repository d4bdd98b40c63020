"""Device and precision (trainers/engine/device.py): the FLOP count against a hand count and torch's own counter,
--device errors, bf16/fp16 autocast on the CPU for every trainer against fp32, device-free checkpoints, gradient
checkpointing against the plain backward, the CPU fp32 path untouched, and smoke runs on every available device."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from torch.utils.flop_counter import FlopCounterMode

from posttrain.cli import main
from posttrain.errors import ConfigError, UserError
from posttrain.models.gpt import GPT, GPTConfig
from posttrain.trainers.engine import device as D
from posttrain.trainers.engine.throughput import peak_flops_of

TASK = ["--task.digits", "1", "--task.num-demos", "20", "--task.num-eval", "8", "--progress", "false"]
TINY_MODEL = ["--model.n-layer", "1", "--model.d-model", "32", "--model.n-head", "2"]
PAIRS = ["--pairs.num-prompts", "16", "--pairs.samples-per-prompt", "4", "--pairs.gold-chosen", "true"]
QUIET = ["--eval-every", "0", "--save-every", "0"]
DEVICES = [pytest.param(d, marks=[pytest.mark.gpu] if d != "cpu" else []) for d in D.available_devices()]


@pytest.fixture(autouse=True)
def no_active_run():
    yield
    D.activate(None)  # a failed run in one test never leaves its device to the next


# ---------------------------------------------------------------------------------------------
# accounting


def test_flops_per_token_against_a_hand_count_and_torchs_flop_counter():
    """Tiny GPT (V=17, L=2, H=2, d=32, no biases), T=16: N = L*(3d^2 + d^2 + 4d^2 + 4d^2) + V*d (the tied output
    projection) = 2*12*1024 + 544 = 25120 matmul weights, plus 5 LayerNorms of d weights (counted in N, as
    nanoGPT does). Attention: 12*L*H*Q*T = 12*2*2*16*16 = 12288. torch's FlopCounterMode counts only matmuls
    (naive attention: QK^T and AV are bmm), so it must equal B*T*(6*25120 + 12288) exactly."""
    torch.manual_seed(0)
    V, L, H, d, T, B = 17, 2, 2, 32, 16, 3
    m = GPT(GPTConfig(vocab_size=V, n_layer=L, n_head=H, d_model=d, max_seq_len=32, attn_backend="naive", bias=False))
    n_matmul = L * (3 * d * d + d * d + 4 * d * d + 4 * d * d) + V * d
    assert n_matmul == 25120
    assert D.matmul_params(m) == n_matmul + (2 * L + 1) * d  # LayerNorm weights; the position table left out
    assert D.flop_shape(m) == (L, H, d // H)
    assert D.flops_per_token(n_matmul, L, H, d // H, T) == 6 * 25120 + 12288
    ids = torch.randint(0, V, (B, T))
    with FlopCounterMode(display=False) as fc:
        m(ids).logits.sum().backward()
    assert fc.get_total_flops() == B * T * D.flops_per_token(n_matmul, L, H, d // H, T)


def test_gpt2_small_worked_number_of_the_docstring():
    """The module docstring's GPT-2 small figure: 855,166,464 FLOPs per token at T=1024 (N from the model itself)."""
    cfg = GPTConfig(vocab_size=50257, n_layer=12, n_head=12, d_model=768, max_seq_len=1024)
    with torch.device("meta"):
        m = GPT(cfg)
    assert m.num_parameters() == 124_439_808
    n = D.matmul_params(m)
    assert n == 124_439_808 - 1024 * 768
    assert D.flops_per_token(n, *D.flop_shape(m), 1024) == 855_166_464


@pytest.mark.parametrize(
    "name, dtype, want",
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H100 NVL", "bf16", 835e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA GH200 480GB", "bf16", 989e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA L40S", "bf16", 362e12),
        ("NVIDIA A10G", "bf16", 70e12),
        ("NVIDIA A10", "fp16", 125e12),
        ("Some Future GPU", "bf16", None),
    ],
)
def test_peak_table_picks_the_most_specific_name(name, dtype, want):
    assert peak_flops_of(name, dtype) == want


def test_cpu_has_no_mfu_and_reports_max_rss():
    assert D.peak_flops("cpu") is None
    mem, kind = D.peak_memory("cpu")
    assert kind == "cpu_max_rss" and mem > 0
    rd = D.RunDevice()
    rd.count(torch.zeros(2, 8, dtype=torch.long), 1000, (1, 1, 8))
    m = rd.step_metrics(0.5)
    assert m == {"train_tokens_per_s": 32.0}  # 16 positions in 0.5 s; no "mfu" without a peak
    s = rd.summary()
    assert s["mfu"] is None and s["train_tokens_per_s"] == 32.0 and s["peak_memory_kind"] == "cpu_max_rss"


# ---------------------------------------------------------------------------------------------
# --device


def test_device_specs():
    assert D.resolve_device("cpu") == torch.device("cpu")
    assert D.resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("gpu", "cuda:", "cuda:x", "CPU", ""):
        with pytest.raises(ConfigError, match="choose auto, cpu, cuda or cuda:N"):
            D.resolve_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("spec", ["cuda", "cuda:1"])
def test_cuda_without_cuda_is_a_user_error(spec):
    with pytest.raises(UserError, match=f"--device {spec}: no CUDA device is available"):
        D.resolve_device(spec)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_device_cuda_without_cuda_is_one_line_exit_2(tmp_path):
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "posttrain", "sft", "--device", "cuda", "--steps", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda: no CUDA device is available" in lines[0], r.stderr
    assert not out.exists()  # refused before anything is written


@pytest.mark.parametrize("command", ["sft", "rm", "dpo", "grpo", "ppo"])
def test_every_trainer_has_the_device_flags(command):
    from posttrain.cli import build_parser

    sub = next(a for a in build_parser([command])._actions if isinstance(a.choices, dict))
    help_text = sub.choices[command].format_help()
    for flag in ("--device", "--dtype", "--grad-checkpointing", "--compile"):
        assert flag in help_text, (command, flag)


def test_cli_device_typo_is_exit_2(tmp_path, capsys):
    assert main(["sft", "--device", "gpu", "--steps", "1", "--out", str(tmp_path / "r")]) == 2
    assert "device='gpu' is not valid" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# placing a model


def _grads(model, ids):
    model.zero_grad(set_to_none=True)
    out = model(ids).logits
    (out.float() ** 2).mean().backward()
    return out.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_cpu_fp32_placement_is_bitwise_the_plain_model():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=17, n_layer=2, n_head=2, d_model=32, max_seq_len=32, dropout=0.1)
    plain = GPT(cfg)
    placed = D.place(GPT(cfg), D.RunDevice())
    placed.load_state_dict(plain.state_dict())
    ids = torch.randint(0, 17, (3, 12))
    torch.manual_seed(1)
    want, gw = _grads(plain, ids)
    torch.manual_seed(1)
    got, gg = _grads(placed, ids)
    assert torch.equal(got, want) and all(torch.equal(gg[k], gw[k]) for k in gw)
    assert isinstance(placed, GPT) and type(placed).__name__ == "GPT"


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_grad_checkpointing_gives_the_plain_gradients(dropout):
    """Per-block recomputation (RNG state restored: the same dropout masks) against the stored-activation backward."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=17, n_layer=3, n_head=2, d_model=32, max_seq_len=32, dropout=dropout)
    plain, ck = GPT(cfg), GPT(cfg)
    ck.load_state_dict(plain.state_dict())
    D.place(ck, D.RunDevice(grad_checkpointing=True))
    assert ck.grad_checkpointing
    ids = torch.randint(0, 17, (4, 16))
    torch.manual_seed(3)
    want, gw = _grads(plain, ids)
    torch.manual_seed(3)
    got, gg = _grads(ck, ids)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    for k in gw:
        torch.testing.assert_close(gg[k], gw[k], atol=1e-7, rtol=1e-5, msg=k)


def test_grad_checkpointing_of_a_hugging_face_model():
    pytest.importorskip("transformers")
    from posttrain.models.hf import hf_model_from_config, tiny_hf_config

    torch.manual_seed(0)
    cfg = tiny_hf_config("qwen2", vocab_size=17, n_layer=2, n_head=2, d_model=32, max_seq_len=32)
    plain, ck = hf_model_from_config(cfg), hf_model_from_config(cfg)
    ck.load_state_dict(plain.state_dict())
    plain.train(), ck.train()
    D.enable_grad_checkpointing(ck)
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in ck.modules())
    ids = torch.randint(3, 17, (2, 10))
    _, gw = _grads(plain, ids)
    _, gg = _grads(ck, ids)
    for k in gw:
        torch.testing.assert_close(gg[k], gw[k], atol=1e-7, rtol=1e-5, msg=k)


def test_bf16_autocast_forward_keeps_fp32_weights_and_is_close():
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=17, n_layer=2, n_head=2, d_model=32, max_seq_len=32)
    plain, placed = GPT(cfg), GPT(cfg)
    placed.load_state_dict(plain.state_dict())
    D.place(placed, D.RunDevice(dtype="bf16"))
    ids = torch.randint(0, 17, (2, 12))
    got = placed(ids).logits
    assert got.dtype == torch.bfloat16 and all(p.dtype == torch.float32 for p in placed.parameters())
    torch.testing.assert_close(got.float(), plain(ids).logits, atol=0.05, rtol=0.05)  # bf16: 8 mantissa bits


def test_sampler_cache_follows_the_device_and_compute_dtype():
    from posttrain.generate import SamplingConfig, generate

    torch.manual_seed(0)
    model = D.place(
        GPT(GPTConfig(vocab_size=17, n_layer=1, n_head=2, d_model=32, max_seq_len=32)), D.RunDevice("cpu", "bf16")
    )
    cache = model.make_cache(2, 8)
    assert cache.k.dtype == torch.bfloat16 and cache.k.device == model.wte.weight.device
    gen = generate(model, [[1, 2], [3]], pad_id=0, eos_id=None, cfg=SamplingConfig(max_new_tokens=4))
    assert gen.completion_ids.shape == (2, 4) and torch.isfinite(gen.logps).all()


@pytest.mark.parametrize(
    "where",
    [pytest.param(d, marks=[pytest.mark.slow] if d == "cpu" else [pytest.mark.gpu]) for d in D.available_devices()],
)
def test_compile_matches_eager(where):
    """--compile (each block through torch.compile) against the eager model: forward and gradients."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=17, n_layer=2, n_head=2, d_model=32, max_seq_len=32)
    eager, compiled = GPT(cfg).to(where), GPT(cfg)
    compiled.load_state_dict(eager.state_dict())
    D.place(compiled, D.RunDevice(torch.device(where), compile=True))
    ids = torch.randint(0, 17, (2, 12), device=where)
    want, gw = _grads(eager, ids)
    got, gg = _grads(compiled, ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    for k in gw:
        torch.testing.assert_close(gg[k], gw[k], atol=1e-6, rtol=1e-4, msg=k)


def test_fp16_overflow_drops_the_step_and_halves_the_scale():
    torch.manual_seed(0)
    rd = D.activate(D.RunDevice(dtype="fp16"))
    model = D.place(GPT(GPTConfig(vocab_size=17, n_layer=1, n_head=2, d_model=32, max_seq_len=32)), rd)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.randint(0, 17, (2, 8))
    (model(ids).logits.float().mean() * 1e30).backward()  # x 65536 in fp16: inf gradients
    from posttrain.trainers.common import grad_norm_and_clip

    assert grad_norm_and_clip(model, 1.0) == 0.0 and rd.loss_scale.overflows == 1
    assert all(p.grad is None for p in model.parameters())
    opt.step()
    assert all(torch.equal(model.state_dict()[k], before[k]) for k in before) and not opt.state
    model(ids)  # the next scaled forward applies the decision
    assert rd.loss_scale.scale == 2.0**15
    # a clean step: the gradients are those of the unscaled loss
    model.zero_grad(set_to_none=True)
    model(ids).logits.float().mean().backward()
    g16 = {n: p.grad.clone() for n, p in model.named_parameters()}
    grad_norm_and_clip(model, 0.0)
    ref = GPT(GPTConfig(vocab_size=17, n_layer=1, n_head=2, d_model=32, max_seq_len=32))
    ref.load_state_dict(model.state_dict())
    ref(ids).logits.mean().backward()
    for n, p in ref.named_parameters():
        assert not torch.equal(g16[n], p.grad)  # they were scaled before unscaling
        torch.testing.assert_close(model.get_parameter(n).grad, p.grad, atol=1e-3, rtol=0.05, msg=n)


# ---------------------------------------------------------------------------------------------
# every trainer in bf16 on the CPU against fp32


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft")
    assert main(["sft", "--out", str(out), "--steps", "4", "--batch-size", "8", *QUIET, *TINY_MODEL, *TASK]) == 0
    return str(out)


def _args(trainer: str, sft: str) -> list[str]:
    if trainer == "sft":
        return ["--steps", "3", "--batch-size", "8", "--restarts", "1", *TINY_MODEL]
    if trainer in ("rm", "dpo"):
        return ["--preset", "tiny", "--init", sft, "--steps", "3", "--batch-size", "4", *PAIRS]
    return ["--init", sft, "--steps", "3", "--prompts-per-step", "2", "--num-generations", "2"]


def _losses(run, key: str = "loss") -> list[float]:
    """``key`` of each step's metrics line (evaluation-only lines, such as RL's step 0, have none)."""
    rows = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if key in r]


# What each trainer's comparison reads: the loss, or for RL (whose group-normalised policy loss sits near 0 at any
# precision) the policy's entropy over the sampled completions, a forward-computed number of order 1.
COMPARED = {"sft": "loss", "rm": "loss", "dpo": "loss", "grpo": "entropy", "ppo": "entropy"}


# Tolerance: bf16 keeps 8 bits of mantissa (relative rounding 2^-9 ~ 0.2 % per operation); over a tiny model, three
# steps and sampled rollouts the losses stay within 0.05 + 10 % of fp32's. RL losses start at the same samples
# (the draw is seeded) but a changed logit can change a sampled token, hence the absolute floor.
ATOL, RTOL = 0.05, 0.10


@pytest.mark.parametrize("trainer", ["sft", "rm", "dpo", "grpo", "ppo"])
def test_bf16_autocast_trains_every_trainer_close_to_fp32(trainer, sft, tmp_path):
    runs = {}
    for dtype in ("fp32", "bf16"):
        runs[dtype] = tmp_path / dtype
        argv = [trainer, "--out", str(runs[dtype]), "--dtype", dtype, *QUIET, *_args(trainer, sft), *TASK]
        assert main(argv) == 0
    want, got = _losses(runs["fp32"], COMPARED[trainer]), _losses(runs["bf16"], COMPARED[trainer])
    assert len(got) == len(want) == 3 and all(math.isfinite(x) for x in got)
    assert got != want  # bf16 really computed (an ignored --dtype would be bitwise fp32)
    for g, w in zip(got, want):
        assert abs(g - w) <= ATOL + RTOL * abs(w), (got, want)
    s = json.loads((runs["bf16"] / "summary.json").read_text())
    assert s["dtype"] == "bf16" and s["device"] == "cpu" and s["train_tokens_per_s"] > 0
    assert s["peak_memory_kind"] == "cpu_max_rss" and s["mfu"] is None
    if trainer in ("grpo", "ppo"):
        assert s["rollout_tokens_per_s"] > 0
        steps = [r for r in map(json.loads, (runs["bf16"] / "metrics.jsonl").open()) if "loss" in r]
        assert steps and all(r["rollout_tokens_per_s"] > 0 for r in steps)


def test_fp16_is_refused_where_the_loss_scale_cannot_reach(sft, tmp_path, capsys):
    argv = ["rm", "--dtype", "fp16", "--out", str(tmp_path / "rm"), *QUIET, *_args("rm", sft), *TASK]
    assert main(argv) == 2
    assert "--dtype fp16 is not supported by `posttrain rm` (use --dtype bf16)" in capsys.readouterr().err
    assert not (tmp_path / "rm").exists()


def test_fp16_sft_is_close_to_fp32(sft, tmp_path):
    runs = {}
    for dtype in ("fp32", "fp16"):
        runs[dtype] = tmp_path / dtype
        assert main(["sft", "--out", str(runs[dtype]), "--dtype", dtype, *QUIET, *_args("sft", sft), *TASK]) == 0
    want, got = _losses(runs["fp32"]), _losses(runs["fp16"])
    for g, w in zip(got, want):
        assert abs(g - w) <= ATOL + RTOL * abs(w), (got, want)
    assert json.loads((runs["fp16"] / "summary.json").read_text())["fp16_overflow_steps"] == 0


def test_bf16_checkpoint_loads_in_fp32_and_evaluates_the_same(tmp_path):
    """The weights are written as fp32 CPU tensors; loaded without autocast they give logits within bf16's rounding
    of the run's own bf16 forward, and `posttrain eval` of the checkpoint scores what the run's final evaluation
    (in bf16) scored, to within one problem in eight."""
    from posttrain.checkpoints.load import load_checkpoint

    run = tmp_path / "bf16"
    argv = ["sft", "--out", str(run), "--dtype", "bf16", "--steps", "6", "--batch-size", "8", "--restarts", "1"]
    assert main([*argv, "--eval-every", "0", *TINY_MODEL, *TASK]) == 0
    with safe_open(str(run / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}
    model = load_checkpoint(run / "model").model
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
    ids = torch.randint(0, model.config.vocab_size, (2, 10))
    with torch.no_grad():
        fp32 = model(ids).logits
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf16 = model(ids).logits
    torch.testing.assert_close(bf16.float(), fp32, atol=0.05, rtol=0.05)
    assert main(["eval", str(run), "--out", str(tmp_path / "ev")]) == 0
    ran = json.loads((run / "summary.json").read_text())["heldout_accuracy"]
    ev = json.loads((tmp_path / "ev" / "summary.json").read_text())
    acc = ev.get("heldout_accuracy", ev.get("accuracy"))
    assert abs(acc - ran) <= 1 / 8 + 1e-9
    assert main(["eval", str(run), "--dtype", "bf16", "--out", str(tmp_path / "ev16")]) == 0  # as the run evaluated
    ev16 = json.loads((tmp_path / "ev16" / "summary.json").read_text())
    assert abs(ev16.get("heldout_accuracy", ev16.get("accuracy")) - ran) <= 1 / 8 + 1e-9
    if not torch.cuda.is_available():
        assert main(["eval", str(run), "--device", "cuda"]) == 2


# ---------------------------------------------------------------------------------------------
# the same smoke runs on every device this machine has (CUDA ones are marked gpu)


@pytest.mark.parametrize("where", DEVICES)
def test_trainers_run_on_every_available_device(where, sft, tmp_path):
    dtype = "bf16" if where != "cpu" else "fp32"
    for trainer in ("sft", "rm", "dpo", "grpo", "ppo"):
        out = tmp_path / trainer
        argv = [trainer, "--out", str(out), "--device", where, "--dtype", dtype, *QUIET, *_args(trainer, sft), *TASK]
        assert main(argv) == 0
        s = json.loads((out / "summary.json").read_text())
        assert s["device"].startswith(where) and s["dtype"] == dtype
        assert all(math.isfinite(x) for x in _losses(out))
        if where != "cpu":
            assert s["peak_memory_kind"] == "cuda_max_allocated" and s["peak_memory_gb"] > 0


def test_hugging_face_models_load_with_the_attention_implementation_asked(tmp_path):
    pytest.importorskip("transformers")
    from posttrain.models.hf import hf_model_from_config, tiny_hf_config
    from posttrain.models.loading import load_hf_model

    hf_model_from_config(tiny_hf_config("qwen2", vocab_size=17)).save_pretrained(tmp_path)
    assert load_hf_model(tmp_path, attn_implementation="eager").config._attn_implementation == "eager"
    assert load_hf_model(tmp_path, attn_implementation="sdpa").config._attn_implementation == "sdpa"


def test_to_device_moves_every_tensor_and_nothing_on_the_cpu():
    """Moved to the meta device (a stand-in for a GPU on a CPU-only machine): tensors in tuples, lists, dicts and
    dataclasses move, everything else stays; on the CPU the very same object comes back."""
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Batch:
        ids: torch.Tensor
        names: list
        extra: dict

    b = Batch(torch.ones(2, 3), ["a", "b"], {"mask": torch.zeros(2), "n": 3})
    obj = (b, [torch.arange(3), "x"], 7)
    assert D.to_device(obj, torch.device("cpu")) is obj and D.to_device(obj) is obj  # no active run: nothing moves
    got = D.to_device(obj, torch.device("meta"))
    assert got[0].ids.is_meta and got[0].extra["mask"].is_meta and got[1][0].is_meta
    assert got[0].names == ["a", "b"] and got[0].extra["n"] == 3 and got[1][1] == "x" and got[2] == 7
    assert got[0].ids.shape == (2, 3) and not obj[0].ids.is_meta  # the original is untouched


def test_ppo_with_a_value_head_on_the_policy_trains_in_bf16(sft, tmp_path):
    """value_model=shared: the head reads the policy's bf16 hidden states under autocast; values are kept in fp32."""
    out = tmp_path / "ppo"
    argv = ["ppo", "--out", str(out), "--dtype", "bf16", "--value-model", "shared", *QUIET, *_args("ppo", sft), *TASK]
    assert main(argv) == 0
    rows = [r for r in map(json.loads, (out / "metrics.jsonl").open()) if "loss" in r]
    assert len(rows) == 3 and all(math.isfinite(r["loss"]) and math.isfinite(r["entropy"]) for r in rows)


@pytest.mark.gpu
def test_checkpoint_rng_state_carries_the_gpus():
    from posttrain.trainers.checkpoint import restore_rng, rng_state

    torch.cuda.init()
    st = rng_state()
    want = torch.rand(4, device="cuda")
    torch.rand(10, device="cuda")
    restore_rng(st)
    assert "cuda" in st and torch.equal(torch.rand(4, device="cuda"), want)


def test_the_run_device_is_released_however_the_loop_ends():
    """A step that raises (a diverged run's stop, a bad batch) still releases the run's device: a later command in
    the same process (eval, another run) is not summarised or placed as this run's part."""
    from types import SimpleNamespace

    from posttrain.trainers.engine.run import run

    def boom(step):
        raise RuntimeError("a step failed")

    cfg = SimpleNamespace(steps=3, progress=False, eval_every=0, save_every=0)
    t = SimpleNamespace(cfg=cfg, start_step=0, name="sft", model=torch.nn.Linear(1, 1), train_step=boom)
    D.activate(D.RunDevice())
    with pytest.raises(RuntimeError, match="a step failed"):
        run(t)
    assert D.active() is None


def test_hugging_face_model_sft_in_bf16_with_grad_checkpointing(tmp_path):
    """A user's Qwen2 directory: bf16 with per-layer checkpointing trains close to fp32 without it, and the
    written model is fp32 in transformers' layout."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(Path(__file__).parents[1] / "models"))  # the suite runs with --import-mode=importlib
    from _hfdirs import make_model_dir

    model = make_model_dir(tmp_path / "mymodel", "qwen2")
    data = tmp_path / "d.jsonl"
    rows = [{"prompt": f"colour {i}?", "completion": w} for i, w in enumerate(["red", "blue", "green", "gold"] * 4)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runs = {}
    for name, extra in (("fp32", []), ("bf16", ["--dtype", "bf16", "--grad-checkpointing"])):
        runs[name] = tmp_path / name
        argv = ["sft", "--model", str(model), "--data", str(data), "--out", str(runs[name]), "--steps", "3"]
        assert main([*argv, "--batch-size", "4", *QUIET, "--max-new-tokens", "2", "--progress", "false", *extra]) == 0
    want, got = _losses(runs["fp32"]), _losses(runs["bf16"])
    assert got != want and all(abs(g - w) <= ATOL + RTOL * abs(w) for g, w in zip(got, want)), (got, want)
    with safe_open(str(runs["bf16"] / "model" / "model.safetensors"), "pt") as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {"F32"}


def test_bf16_run_resumes_bitwise(tmp_path, capsys):
    """A bf16 run's checkpoint (fp32 weights and optimizer state) resumes to the uninterrupted run's weights exactly
    (constant LR, so the step count does not change the schedule)."""
    from safetensors.torch import load_file

    base = ["--dtype", "bf16", "--batch-size", "8", "--restarts", "1", "--warmup-steps", "0", "--min-lr-ratio", "1"]
    base += [*QUIET, *TINY_MODEL, *TASK]
    full, part = tmp_path / "full", tmp_path / "part"
    assert main(["sft", "--out", str(full), "--steps", "4", *base]) == 0
    assert main(["sft", "--out", str(part), "--steps", "2", *base]) == 0
    capsys.readouterr()
    assert main(["sft", "--resume", str(part), "--steps", "4", "--progress", "false"]) == 0
    assert "steps 2->4" in capsys.readouterr().out  # continued from step 2, not retrained
    got, want = (load_file(str(d / "model" / "model.safetensors")) for d in (part, full))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
