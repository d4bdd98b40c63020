"""PPO under several processes: a 2-process gloo run ends with the 1-process run's policy, critic and beta.

The oracle is the same config trained in one process on the same global batch. Sampling is the one part that
is per rank by design (each rank draws its own stream), so both runs sample through an engine that seeds each
prompt's samples from the prompt and the step alone: the global batch is then the same at any world size, and
everything downstream (recomputed pi_old and V_old, reward whitening, GAE, advantage whitening over the global
batch, token-mean normalisers, gradients of policy and critic, the adaptive beta, the target-KL stop) must
match; and rank 0's checkpoint of the 2-process run, resumed in one process, ends as the uninterrupted run (the
engine counts steps from the resumed step). The processes are spawned by the test (a ``file://`` rendezvous, no
ports), as ``torchrun`` would.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # three processes (~10 s on an idle 2-core machine)

SCRIPT = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from posttrain.engines.batching import assemble
    from posttrain.generate import generate
    from posttrain.models.gpt import GPTConfig
    from posttrain.tasks.arithmetic import ArithmeticConfig
    from posttrain.trainers.ppo import PPOConfig, PPOTrainer
    from posttrain.trainers.sft import SFTConfig, train_sft
    rank, world, init_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    TASK = ArithmeticConfig(digits=1, num_demos=30, num_eval=8)
    sft, resume = (sys.argv[5] if len(sys.argv) > 5 else out + ".sft"), (sys.argv[6] if len(sys.argv) > 6 else None)
    resume, fsdp = resume or None, len(sys.argv) > 7 and sys.argv[7] == "fsdp"
    if len(sys.argv) == 5:  # the first 1-process run makes the starting policy; the later runs reuse it
        # 60 steps: a policy that is right on some prompts, so every step's rewards vary (30 left steps 1-2 all 0)
        train_sft(SFTConfig(out=sft, steps=60, batch_size=16, eval_every=0, save_every=0, progress=False, task=TASK,
                            model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=24)))
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)

    class PerPrompt:
        # samples of a prompt depend on (step, prompt) only, not on the rank or on the other prompts of the batch
        matched = True  # our sampler's log-probs: the IS weights are 1
        def __init__(self, model, tok):
            self.model, self.tok, self.calls = model, tok, 0
        def generate(self, prompt_ids, n, sampling, generator=None, step=None):
            comps, lps = [], []
            for p in prompt_ids:
                g = generate(self.model, [p], pad_id=self.tok.pad_id, eos_id=self.tok.eos_id, cfg=sampling,
                             generator=torch.Generator().manual_seed(hash((self.calls, tuple(p))) % 2**62))
                for i in range(n):
                    m = g.completion_mask[i].bool()
                    comps.append(g.completion_ids[i][m].tolist())
                    lps.append(g.logps[i][m].tolist())
            self.calls += 1
            return assemble(prompt_ids, comps, lps, n, pad_id=self.tok.pad_id, eos_id=self.tok.eos_id,
                            max_new_tokens=sampling.max_new_tokens)
        def load_weights(self, named_tensors):
            pass
        def reset_cache(self):
            pass

    runs = {"main": dict(kl_control="adaptive", beta=0.1, kl_target=1e-3, kl_horizon=10, critic_warmup=1,
                         whiten_rewards=True, save_every=2, mu=2),
            "stop": dict(target_kl=1e-4, mu=3, save_every=0)}
    for name, kw in (runs.items() if resume is None and not fsdp else [("main", runs["main"])]):
        cfg = PPOConfig(init=sft, out=out + "." + name, steps=3, prompts_per_step=4, num_generations=3,
                        max_new_tokens=4, eval_every=0, progress=False, task=TASK, warmup_steps=0, lr=1e-3,
                        minibatches=2, grad_accum=6 if fsdp else 2, fsdp=fsdp, **kw)  # FSDP: dummy micro-batches
        tr = PPOTrainer(cfg, resume=resume)
        tr.engine = PerPrompt(tr.model if tr.replica is None else tr.replica, tr.tokenizer)  # FSDP: the replica
        tr.engine.calls = tr.start_step  # one call per step: a resumed run draws what the uninterrupted one drew
        tr.train()
    del tr  # FSDP keeps its last collectives' work objects: freed now, not at interpreter exit (a gloo SIGABRT)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


def _run(tmp_path: Path, world: int, *extra, out: Path | None = None) -> Path:
    out = out or tmp_path / f"w{world}"
    init = tmp_path / f"{out.name}.rendezvous"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(r), str(world), str(init), str(out), *extra],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = [p.communicate(timeout=240)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ppo_dist")
    one = _run(tmp, 1)
    two = _run(tmp, 2, str(one) + ".sft")
    return one, two, tmp


def test_a_two_process_checkpoint_resumes_in_one_process_to_the_uninterrupted_end(runs):
    """Rank 0's step-2 checkpoint of the 2-process run (policy, critic, both optimizers, beta, RNG), resumed in one
    process, ends with the uninterrupted 1-process run's policy, critic and beta."""
    import shutil

    one, two, tmp = runs
    resumed = tmp / "r.main"
    shutil.copytree(f"{two}.main", resumed)
    shutil.rmtree(resumed / "model")  # written again by the resumed run
    _run(tmp, 1, str(one) + ".sft", str(resumed / "checkpoints" / "step-00000002"), out=tmp / "r")
    _assert_same_weights(Path(f"{one}.main"), resumed)
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (Path(f"{one}.main"), resumed))
    assert abs(s1["beta"] - s2["beta"]) <= 1e-9 and s2["steps"] == 3


def _assert_same_weights(one: Path, two: Path) -> None:
    """model/'s policy and critic of two runs, to 5e-5 (the attention key bias to 1e-3: see inside)."""
    for f in ("model.safetensors", "critic.safetensors"):
        _assert_same_tensors(load_file(one / "model" / f), load_file(two / "model" / f), f)


def _assert_same_tensors(a: dict, b: dict, where: str, atol: float = 5e-5) -> None:
    assert a.keys() == b.keys()
    for k in a:
        x, y = a[k], b[k]
        if k.endswith("attn.qkv.bias"):  # the key bias's exact gradient is 0 (softmax ignores a shift); Adam
            # scales its float noise, summed in another order on two ranks, up to lr-sized steps: its own floor,
            # one lr = 1e-3 (2e-4 seen after 8 policy steps; every other weight agrees to ~1e-7)
            d = x.numel() // 3
            torch.testing.assert_close(y[d : 2 * d], x[d : 2 * d], atol=1e-3, rtol=0, msg=f"{where}: {k} (keys)")
            x, y = torch.cat([x[:d], x[2 * d :]]), torch.cat([y[:d], y[2 * d :]])
        # Adam's steps are lr-sized whatever a gradient's scale, so the float noise of a small entry (summed in
        # another order) can move it by a fraction of lr = 1e-3 a step (~1e-5 seen after 12): a 5e-5 floor
        torch.testing.assert_close(y, x, atol=atol, rtol=1e-5, msg=f"{where}: {k}")


def _metrics(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("name", ["main", "stop"])
def test_two_process_ppo_ends_with_the_one_process_policy_critic_and_beta(runs, name):
    one, two = (Path(f"{d}.{name}") for d in runs[:2])
    _assert_same_weights(one, two)
    s1, s2 = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert abs(s1["beta"] - s2["beta"]) <= 1e-9 * max(1.0, s1["beta"])
    m1, m2 = _metrics(one), _metrics(two)
    assert [r["step"] for r in m2] == [r["step"] for r in m1]  # one log, written by rank 0
    # not a degenerate batch: rewards vary at every step (else returns are constant, explained variance NaN)
    assert all(r["reward_std"] > 0 for r in m1[1:]), [r["reward_std"] for r in m1[1:]]
    for r1, r2 in zip(m1[1:], m2[1:]):  # Adam hides a gradient off by a constant factor; the global norms show it
        for k in (
            "loss",
            "value_loss",
            "grad_norm",
            "critic_grad_norm",
            "kl_per_seq",
            "reward_std",
            "advantage_std",
            "explained_variance",
            "value_max",
            "approx_kl",
        ):
            assert abs(r1[k] - r2[k]) <= 5e-5 * max(1.0, abs(r1[k])), (k, r1[k], r2[k])
        for k in ("optimizer_steps", "early_stopped", "beta"):
            assert r1[k] == pytest.approx(r2[k], rel=1e-12, abs=0), k
    if name == "main":
        assert m1[-1]["beta"] != 0.1 and any(r["grad_norm"] > 1e-3 for r in m1[1:])  # beta moved; a real update
        files = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())  # noqa: E731
        assert files(two) == files(one)  # checkpoints and model/ written once, by rank 0
    else:  # the target-KL stop fired, on every rank at the same minibatch (else the ranks would deadlock)
        assert any(r["early_stopped"] for r in m1[1:]) and any(r["optimizer_steps"] < 6 for r in m1[1:])


def test_fsdp_ppo_equals_one_process_and_its_shards_resume_in_one_process(runs):
    """ppo --fsdp on 2 processes (policy and critic sharded, the reference whole on each rank): model/'s policy and
    critic (gathered) equal the 1-process run's; the step-2 shards export to a plain checkpoint with its critic;
    resumed in one process from those shards, the run ends as the uninterrupted one."""
    import shutil

    from posttrain.cli import main

    one, _, tmp = runs
    fsdp = _run(tmp, 2, str(one) + ".sft", "", "fsdp", out=tmp / "f")
    _assert_same_weights(Path(f"{one}.main"), Path(f"{fsdp}.main"))
    m1, m2 = _metrics(Path(f"{one}.main")), _metrics(Path(f"{fsdp}.main"))
    for r1, r2 in zip(m1[1:], m2[1:]):
        for k in ("loss", "value_loss", "grad_norm", "critic_grad_norm", "kl_per_seq", "approx_kl"):
            assert abs(r1[k] - r2[k]) <= 5e-5 * max(1.0, abs(r1[k])), (k, r1[k], r2[k])
    step2 = Path(f"{fsdp}.main") / "checkpoints" / "step-00000002"
    assert (step2 / "dcp").is_dir() and not (step2 / "model.safetensors").exists()  # sharded, for resume only
    assert main(["export", str(step2), "--out", str(tmp / "exported")]) == 0
    ref = Path(f"{one}.main") / "checkpoints" / "step-00000002"
    for f in ("model.safetensors", "critic.safetensors"):  # the 1-process step-2 checkpoint's policy and critic
        _assert_same_tensors(load_file(ref / f), load_file(tmp / "exported" / f), f, atol=1e-4)
    resumed = tmp / "rf.main"
    shutil.copytree(f"{fsdp}.main", resumed)
    shutil.rmtree(resumed / "model")  # written again by the resumed run
    _run(tmp, 1, str(one) + ".sft", str(resumed / "checkpoints" / "step-00000002"), out=tmp / "rf")
    _assert_same_weights(Path(f"{one}.main"), resumed)
