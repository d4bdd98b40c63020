"""Trainers under several processes: a 2-process gloo run gives the 1-process update on the same global batch.

The processes are spawned by the test (no ports: a ``file://`` rendezvous) and run the Python API exactly as
``torchrun`` would run the CLI; the oracle is the same config trained in one process.
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

from posttrain.trainers.distributed import World, global_sum, mean_metrics, shard, shard_bounds

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 64])
@pytest.mark.parametrize("w", [1, 2, 3, 4])
def test_shards_are_contiguous_disjoint_and_cover_every_row(n, w):
    if n < w:
        with pytest.raises(Exception, match="cannot be split"):
            shard_bounds(n, World(0, w))
        return
    rows = [i for r in range(w) for i in shard(list(range(n)), World(r, w))]
    assert rows == list(range(n))  # no row repeated, none dropped (a DistributedSampler would pad)
    sizes = [len(shard(range(n), World(r, w))) for r in range(w)]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("n,k", [(0, 2), (1, 3), (2, 3), (5, 2), (8, 8)])
def test_fsdp_micro_batches_are_exactly_grad_accum_and_keep_every_row_once(n, k):
    from posttrain.trainers.sharded import fixed_micro_batches

    rows = torch.arange(10, 10 + n)
    got = fixed_micro_batches(rows, k)
    assert len(got) == k  # the same number of FSDP passes on every rank, whatever its share of the minibatch
    real = [r for m, dummy in got if not dummy for r in m.tolist()]
    assert real == rows.tolist()  # no row repeated or dropped among the real ones
    assert all(m.tolist() == [0] for m, dummy in got if dummy) and sum(d for _, d in got) == max(0, k - n)


def test_one_process_helpers_are_the_identity():
    w = World()
    assert global_sum(3, w) == 3 and mean_metrics({"loss": 1.5, "note": "x"}, w) == {"loss": 1.5, "note": "x"}


SCRIPT = textwrap.dedent("""
    import os, sys, torch.distributed as dist
    from posttrain.models.gpt import GPTConfig
    from posttrain.tasks.arithmetic import ArithmeticConfig
    from posttrain.trainers.sft import SFTConfig, train_sft
    rank, world, init_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    cfg = SFTConfig(out=out, steps=4, batch_size=12, grad_accum=2, lr=3e-3, warmup_steps=1, eval_every=0,
                    save_every=2, progress=False, max_new_tokens=4,
                    model=GPTConfig(n_layer=1, n_head=2, d_model=32, max_seq_len=32),
                    task=ArithmeticConfig(num_demos=40, num_eval=8))
    train_sft(cfg)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


def _run(tmp_path: Path, world: int, name: str) -> Path:
    out = tmp_path / name
    init = tmp_path / f"{name}.rendezvous"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SCRIPT, str(r), str(world), str(init), str(out)],
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
def one(tmp_path_factory):
    """The oracle: the same config trained in one process (shared by the tests below)."""
    return _run(tmp_path_factory.mktemp("one"), 1, "one")


def test_two_process_sft_equals_one_process_and_only_rank0_writes(tmp_path, one):
    two = _run(tmp_path, 2, "two")
    a, b = load_file(one / "model" / "model.safetensors"), load_file(two / "model" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:  # ~1e-8 apart; the key bias's gradient is 0 in exact arithmetic, and Adam scales its float noise
        # (summed in another order over two ranks) up to ~1e-6: hence the absolute floor
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=1e-5, msg=k)
    files = lambda d: sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())  # noqa: E731
    assert files(two) == files(one)  # the same outputs, written once (no per-rank copies, no leftovers)
    m1 = [json.loads(x) for x in (one / "metrics.jsonl").read_text().splitlines()]
    m2 = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in m2] == [r["step"] for r in m1]  # one log, not one per rank
    for r1, r2 in zip(m1, m2):  # the loss is the global batch's, summed over ranks; the gradient norm (before
        # clipping) is the global one: a normaliser off by a constant factor shows here (Adam would hide it above)
        assert abs(r1["loss"] - r2["loss"]) < 1e-5
        assert abs(r1["grad_norm"] - r2["grad_norm"]) < 1e-5 * max(1.0, r1["grad_norm"])


METRICS_SCRIPT = textwrap.dedent("""
    import json, sys, torch.distributed as dist
    from posttrain.trainers.distributed import World, mean_metrics
    rank, world, init_file, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    w = World(rank, world)
    # rank 1 had no rows this step: no loss statistics (as a policy-gradient update with no signal on that rank)
    step = mean_metrics({"reward": 1.0, "clip_frac": 0.25, "note": "x"} if rank == 0 else {"reward": 3.0}, w)
    after = mean_metrics({"loss": 2.0 * rank}, w)  # the collectives that follow still line up
    with open(f"{out}.{rank}.json", "w") as f:
        json.dump({"step": step, "after": after}, f)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


def test_mean_metrics_when_ranks_report_different_keys(tmp_path):
    """A rank whose step had no rows reports fewer metrics: every rank still reduces the same vector (gloo aborts the
    run on a size mismatch), and a metric is the mean over the ranks that report it."""
    out = _run_script(METRICS_SCRIPT, tmp_path, 2, "m")
    r0, r1 = (json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(2))
    assert r0["step"] == {"reward": 2.0, "clip_frac": 0.25, "note": "x"}  # clip_frac: rank 0's alone
    assert r1["step"] == {"reward": 2.0, "clip_frac": 0.25}
    assert r0["after"] == r1["after"] == {"loss": 1.0}  # reported by both: SUM / W


FSDP_SCRIPT = SCRIPT.replace(
    "train_sft(cfg)",
    "import dataclasses\n"
    "cfg = dataclasses.replace(cfg, fsdp=len(sys.argv) > 5 and sys.argv[5] == 'fsdp')\n"
    "train_sft(cfg, resume=sys.argv[6] if len(sys.argv) > 6 else None)",
)


def _run_script(script, tmp_path, world, name, *extra):
    out = tmp_path / name
    init = tmp_path / f"{name}.{len(extra)}.rendezvous"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(r), str(world), str(init), str(out), *extra],
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


def test_fsdp_two_processes_equal_one_and_its_sharded_checkpoint_resumes_in_one_process(tmp_path, one):
    from posttrain.checkpoints.load import load_checkpoint
    from posttrain.trainers.sharded import consolidate

    two = _run_script(FSDP_SCRIPT, tmp_path, 2, "two", "fsdp")
    a, b = load_file(one / "model" / "model.safetensors"), load_file(two / "model" / "model.safetensors")
    for k in a:  # model/ is published whole (gathered from the shards); same tolerance as DDP above
        torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=1e-5, msg=k)
    step2 = two / "checkpoints" / "step-00000002"
    assert (step2 / "dcp").is_dir() and not (step2 / "model.safetensors").exists()  # sharded, for resume only
    # consolidated by one process (no process group) = the 1-process run's checkpoint at the same step
    plain = consolidate(step2, tmp_path / "consolidated")
    ref = load_file(one / "checkpoints" / "step-00000002" / "model.safetensors")
    got = load_file(plain / "model.safetensors")
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], atol=1e-5, rtol=1e-5, msg=k)
    assert load_checkpoint(plain).step == 2
    # `posttrain export` of the shards (one process): the consolidated weights, as a plain checkpoint or as HF
    from posttrain.cli import main
    from posttrain.models.convert import gpt2_named_tensors

    assert main(["export", str(step2), "--out", str(tmp_path / "exported")]) == 0
    exported = load_file(tmp_path / "exported" / "model.safetensors")
    assert exported.keys() == got.keys() and all(torch.equal(exported[k], got[k]) for k in got)
    assert main(["export", str(step2), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    hf = load_file(tmp_path / "hf" / "model.safetensors")
    named = dict(gpt2_named_tensors(load_checkpoint(plain).model))
    assert set(named) - set(hf) <= {"lm_head.weight"}  # GPT-2 ties lm_head to wte (saved once)
    assert all(torch.equal(hf[k], named[k].contiguous()) for k in hf)
    # resumed at another world size (1 process, unsharded) from the 2-process shards: ends as the 1-process run
    import shutil

    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step-00000004", ignore_errors=True)
    _run_script(FSDP_SCRIPT, tmp_path, 1, "resumed", "plain", str(resumed / "checkpoints" / "step-00000002"))
    c = load_file(resumed / "model" / "model.safetensors")
    for k in a:
        torch.testing.assert_close(c[k], a[k], atol=1e-5, rtol=1e-5, msg=k)


DPO_SCRIPT = textwrap.dedent("""
    import os, sys, torch.distributed as dist
    from posttrain.data.preference_pairs import PairDataConfig
    from posttrain.trainers.dpo import DPOConfig, train_dpo
    rank, world, init_file, out, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    fsdp = len(sys.argv) > 7 and sys.argv[7] == "fsdp"
    train_dpo(DPOConfig(out=out, init=init, loss=sys.argv[6], steps=3, batch_size=6, lr=1e-3, warmup_steps=1,
                        eval_every=0, save_every=2, progress=False, max_new_tokens=4, fsdp=fsdp,
                        pairs=PairDataConfig(num_prompts=48, gold_chosen=True)),
              resume=sys.argv[8] if len(sys.argv) > 8 else None)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


@pytest.fixture(scope="module")
def dpo_one(tmp_path_factory, one):
    """The DPO oracle: 3 steps in one process (shared by the DDP and FSDP tests)."""
    return _run_script(DPO_SCRIPT, tmp_path_factory.mktemp("dpo1"), 1, "dpo1", str(one / "model"), "rpo")


def test_two_process_dpo_equals_one_process(tmp_path, one, dpo_one):
    init = str(one / "model")
    a = dpo_one
    b = _run_script(DPO_SCRIPT, tmp_path, 2, "dpo2", init, "rpo")
    assert (a / "pairs.jsonl").read_bytes() == (b / "pairs.jsonl").read_bytes()  # sampled once, by rank 0
    wa, wb = load_file(a / "model" / "model.safetensors"), load_file(b / "model" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-5, msg=k)
    ma = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    for r1, r2 in zip(ma, mb):
        assert abs(r1["loss"] - r2["loss"]) < 1e-5 and abs(r1["grad_norm"] - r2["grad_norm"]) < 1e-5


def test_fsdp_dpo_two_processes_equal_one_and_resume_in_one_process(tmp_path, one, dpo_one):
    from posttrain.trainers.sharded import consolidate

    init = str(one / "model")
    two = _run_script(DPO_SCRIPT, tmp_path, 2, "dpo_fsdp", init, "rpo", "fsdp")
    step2 = two / "checkpoints" / "step-00000002"
    assert (step2 / "dcp").is_dir() and not (step2 / "model.safetensors").exists()  # sharded, for resume only
    got = load_file(consolidate(step2, tmp_path / "c") / "model.safetensors")
    ref = load_file(dpo_one / "checkpoints" / "step-00000002" / "model.safetensors")
    wa, wb = load_file(dpo_one / "model" / "model.safetensors"), load_file(two / "model" / "model.safetensors")
    for k in wa:  # model/ gathered from the shards, and the step-2 shards, equal the 1-process run's
        torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-5, msg=k)
        torch.testing.assert_close(got[k], ref[k], atol=1e-5, rtol=1e-5, msg=k)
    ma = [json.loads(x) for x in (dpo_one / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (two / "metrics.jsonl").read_text().splitlines()]
    for r1, r2 in zip(ma, mb):
        assert abs(r1["loss"] - r2["loss"]) < 1e-5 and abs(r1["grad_norm"] - r2["grad_norm"]) < 1e-5
    # resumed in one process (unsharded) from the 2-process shards of step 2: ends as the uninterrupted run
    import shutil

    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "model")  # written again by the resumed run
    _run_script(
        DPO_SCRIPT, tmp_path, 1, "resumed", init, "rpo", "plain", str(resumed / "checkpoints" / "step-00000002")
    )
    wc = load_file(resumed / "model" / "model.safetensors")
    for k in wa:
        torch.testing.assert_close(wc[k], wa[k], atol=1e-5, rtol=1e-5, msg=k)


def test_batch_coupled_losses_refuse_several_processes(tmp_path, one):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    init = str(tmp_path / "x.rendezvous")
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", DPO_SCRIPT, str(r), "2", init, str(tmp_path / "o"), str(one / "model"), "aot"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode != 0 for p in procs)
    assert all("couples the examples of a batch" in log for log in logs)


PG_SCRIPT = textwrap.dedent("""
    import dataclasses, os, sys, torch, torch.distributed as dist
    from safetensors.torch import save_file
    from posttrain.trainers.distributed import World, shard_bounds
    from posttrain.trainers.policy_gradient import PolicyGradientConfig, PolicyGradientTrainer, train_policy_gradient
    rank, world, init_file, out, init, mode = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                               sys.argv[5], sys.argv[6])
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    fsdp = len(sys.argv) > 7 and sys.argv[7] == "fsdp"
    cfg = PolicyGradientConfig(out=out, init=init, steps=2, prompts_per_step=4, num_generations=4, max_new_tokens=4,
                               minibatches=2, grad_accum=8 if fsdp else 2, mu=2, beta=0.05, eval_every=0, save_every=0,
                               progress=False, dynamic_sampling=False, lr=1e-3, warmup_steps=0, fsdp=fsdp)
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict
    from posttrain.trainers.sharded import full_parameters
    def dump(tr, name):  # the whole model and Adam's second moments, on rank 0 (gathered from the shards)
        params = full_parameters(tr.model)
        st = get_optimizer_state_dict(tr.model, tr.opt, options=StateDictOptions(full_state_dict=True))["state"]
        if tr.world.is_main:
            save_file({k: v.clone().contiguous() for k, v in params.items()}, name + ".safetensors")
            save_file({k: v["exp_avg_sq"].clone().contiguous() for k, v in st.items()}, name + ".adam.safetensors")
    if mode == "train":
        train_policy_gradient(cfg)
    elif mode == "load":  # one process, from the 2-process FSDP run's shards
        run_dir = os.path.dirname(os.path.dirname(sys.argv[8]))  # a resumed run writes in its own directory
        dump(PolicyGradientTrainer(dataclasses.replace(cfg, out=run_dir), resume=sys.argv[8]), out)
    else:  # the same global rollout on every rank (sampled as one process would), each rank updating on its rows
        tr = PolicyGradientTrainer(cfg)
        real, mets = tr.world, []
        for step in range(2):
            tr.world = World()
            ro = tr.rollout(step)
            tr.world = real  # advantages of both signs (a 4-step SFT start gets every reward equal)
            ro = dataclasses.replace(ro, advantages=torch.randn(ro.sequences.shape[0],
                                                                  generator=torch.Generator().manual_seed(step)))
            a, b = shard_bounds(ro.sequences.shape[0], real)
            part = dataclasses.replace(ro, **{f: getattr(ro, f)[a:b] for f in ("sequences", "attention_mask",
                                       "completion_mask", "old_logps", "ref_logps", "advantages", "prompt_index",
                                       "is_weights")})
            mets.append(tr.update(part, step))
        if real.is_main:
            import json
            open(out + ".json", "w").write(json.dumps([{k: m[k] for k in ("loss", "grad_norm")} for m in mets]))
        dump(tr, out)
        if fsdp:
            tr.save(1, {})  # sharded, every rank its shards: loaded by one process below
        del tr  # FSDP keeps its last collectives' work objects: freed now, not at interpreter exit (a gloo SIGABRT)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


def test_two_process_policy_gradient_update_equals_one_process(tmp_path, one, assert_close_but_key_bias):
    """The update is world-size invariant: global token/sequence normalisers, gradients summed over ranks, over
    epochs x minibatches x micro-batches (sampling differs by world size: each rank draws its own stream)."""
    init = str(one / "model")
    _run_script(PG_SCRIPT, tmp_path, 1, "pg1", init, "update")
    _run_script(PG_SCRIPT, tmp_path, 2, "pg2", init, "update")
    a, b = load_file(str(tmp_path / "pg1.safetensors")), load_file(str(tmp_path / "pg2.safetensors"))
    assert_close_but_key_bias(b, a)
    # Adam hides a gradient off by a constant factor in the parameters; the global gradient norm shows it
    m1, m2 = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("pg1", "pg2"))
    for r1, r2 in zip(m1, m2):
        assert r1["grad_norm"] > 1e-3  # a real update
        assert abs(r1["grad_norm"] - r2["grad_norm"]) <= 1e-5 * max(1.0, r1["grad_norm"]), (r1, r2)
        assert abs(r1["loss"] - r2["loss"]) <= 1e-5, (r1, r2)
    # grpo --fsdp: the same update with the policy sharded (rollouts from the replica; grad_accum 8 > a rank's ~4 rows of
    # a minibatch, so every rank also runs dummy micro-batches of weight 0), and its shards, loaded by one process,
    # hold the run's weights and Adam moments
    _run_script(PG_SCRIPT, tmp_path, 2, "pgf", init, "update", "fsdp")
    c, m3 = load_file(str(tmp_path / "pgf.safetensors")), json.loads((tmp_path / "pgf.json").read_text())
    assert_close_but_key_bias(c, a)
    for r1, r3 in zip(m1, m3):
        assert abs(r1["grad_norm"] - r3["grad_norm"]) <= 1e-5 * max(1.0, r1["grad_norm"]), (r1, r3)
        assert abs(r1["loss"] - r3["loss"]) <= 1e-5, (r1, r3)
    step1 = tmp_path / "pgf" / "checkpoints" / "step-00000001"
    assert (step1 / "dcp").is_dir() and not (step1 / "model.safetensors").exists()
    _run_script(PG_SCRIPT, tmp_path, 1, "pgl", init, "load", "plain", str(step1))
    for name in ("", ".adam"):
        x, y = (load_file(str(tmp_path / f"{n}{name}.safetensors")) for n in ("pgf", "pgl"))
        assert x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x), name


def test_two_process_grpo_run_writes_once(tmp_path, one):
    out = _run_script(PG_SCRIPT, tmp_path, 2, "grpo2", str(one / "model"), "train")
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2] and (out / "model" / "model.safetensors").is_file()
    assert json.loads((out / "summary.json").read_text())["steps"] == 2


RM_SCRIPT = textwrap.dedent("""
    import os, sys, torch.distributed as dist
    from posttrain.data.preference_pairs import PairDataConfig
    from posttrain.trainers.reward import RMConfig, train_reward_model
    rank, world, init_file, out, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    # center_coef > 0: without it the BT loss ignores a shift of every reward, the head bias (and ln_f.bias along the
    # head) get a gradient of exactly 0, and Adam scales their float noise (summed in another order) to lr-sized steps
    fsdp = len(sys.argv) > 6 and sys.argv[6] == "fsdp"
    train_reward_model(RMConfig(out=out, init=init, steps=3, batch_size=6, lr=1e-3, warmup_steps=1, eval_every=0,
                                center_coef=0.1, fsdp=fsdp, batch_by=os.environ.get("RM_BATCH_BY", "pair"),
                                save_every=2, progress=False, eval_prompts=16, stats_pairs=16,
                                pairs=PairDataConfig(num_prompts=24, samples_per_prompt=4, gold_chosen=True)),
                       resume=sys.argv[7] if len(sys.argv) > 7 else None)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


@pytest.fixture(scope="module")
def rm_one(tmp_path_factory, one):
    """The RM oracle: 3 steps in one process (shared by the DDP and FSDP tests)."""
    return _run_script(RM_SCRIPT, tmp_path_factory.mktemp("rm1"), 1, "rm1", str(one / "model"))


def _same_rm(a: Path, b: Path) -> None:
    """Backbone and head of two RM checkpoints, to 1e-5."""
    for f in ("model.safetensors", "reward_head.safetensors"):
        wa, wb = load_file(a / f), load_file(b / f)
        assert wa.keys() == wb.keys(), f
        for k in wa:
            torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-5, msg=f"{f}: {k}")


def test_two_process_reward_model_equals_one_process(tmp_path, one, rm_one):
    init = str(one / "model")
    a = rm_one
    b = _run_script(RM_SCRIPT, tmp_path, 2, "rm2", init)
    assert (a / "pairs.jsonl").read_bytes() == (b / "pairs.jsonl").read_bytes()  # sampled once, by rank 0
    for f in ("model.safetensors", "reward_head.safetensors"):
        wa, wb = load_file(a / "model" / f), load_file(b / "model" / f)
        for k in wa:
            torch.testing.assert_close(wb[k], wa[k], atol=1e-5, rtol=1e-5, msg=k)
    ma = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    mb = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    for r1, r2 in zip(ma, mb):
        assert abs(r1["loss"] - r2["loss"]) < 1e-5 and abs(r1["grad_norm"] - r2["grad_norm"]) < 1e-5


def test_two_process_reward_model_with_prompt_batches_equals_one_process(tmp_path, one, monkeypatch):
    """--batch-by prompt under DDP: each rank scores its share of the step's prompts, its loss weighted by its share
    of the step's pairs, so the 2-process run ends as the 1-process one."""
    monkeypatch.setenv("RM_BATCH_BY", "prompt")
    init = str(one / "model")
    a = _run_script(RM_SCRIPT, tmp_path, 1, "rmp1", init)
    b = _run_script(RM_SCRIPT, tmp_path, 2, "rmp2", init)
    _same_rm(a / "model", b / "model")
    assert json.loads((a / "config.resolved.json").read_text())["batch_by"] == "prompt"


def test_fsdp_reward_model_two_processes_equal_one_export_and_resume_in_one_process(tmp_path, one, rm_one):
    """rm --fsdp on 2 processes: model/ (gathered) and the step-2 shards (exported by `posttrain export`, read by
    load_reward_model) equal the 1-process run's; resumed in 1 process from the shards it ends as that run."""
    import shutil

    from posttrain.cli import main
    from posttrain.rewards.reward_model import load_reward_model

    init = str(one / "model")
    two = _run_script(RM_SCRIPT, tmp_path, 2, "rm_fsdp", init, "fsdp")
    _same_rm(rm_one / "model", two / "model")
    ma, mb = ([json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()] for d in (rm_one, two))
    for r1, r2 in zip(ma, mb):
        assert abs(r1["loss"] - r2["loss"]) < 1e-5 and abs(r1["grad_norm"] - r2["grad_norm"]) < 1e-5
    s1, s2 = (json.loads((d / "model" / "reward_stats.json").read_text()) for d in (rm_one, two))
    assert s1["count"] == s2["count"] and abs(s1["mean"] - s2["mean"]) < 1e-5 and abs(s1["std"] - s2["std"]) < 1e-5
    step2 = two / "checkpoints" / "step-00000002"
    assert (step2 / "dcp").is_dir() and not (step2 / "model.safetensors").exists()  # sharded, for resume only
    assert main(["export", str(step2), "--out", str(tmp_path / "exported")]) == 0
    _same_rm(rm_one / "checkpoints" / "step-00000002", tmp_path / "exported")
    loaded = load_reward_model(tmp_path / "exported")  # what RL reads: backbone + head
    ref = load_reward_model(rm_one / "checkpoints" / "step-00000002")
    ids = torch.randint(1, 10, (3, 7))
    mask = torch.ones_like(ids)
    torch.testing.assert_close(loaded.model(ids, mask), ref.model(ids, mask), atol=1e-5, rtol=1e-5)
    resumed = tmp_path / "resumed"
    shutil.copytree(two, resumed)
    shutil.rmtree(resumed / "model")  # written again by the resumed run
    _run_script(RM_SCRIPT, tmp_path, 1, "resumed", init, "plain", str(resumed / "checkpoints" / "step-00000002"))
    _same_rm(rm_one / "model", resumed / "model")


AVG_SCRIPT = textwrap.dedent("""
    import os, sys, torch.distributed as dist
    from posttrain.trainers.policy_gradient import PolicyGradientConfig, train_policy_gradient
    rank, world, init_file, out, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + init_file, rank=rank, world_size=world)
    cfg = PolicyGradientConfig(out=out, init=init, steps=4, prompts_per_step=4, num_generations=4, max_new_tokens=4,
                               eval_every=0, save_every=2, progress=False, lr=1e-3, warmup_steps=0,
                               dynamic_sampling=False, fsdp=True, average_last=int(sys.argv[6]), average_every=2)
    train_policy_gradient(cfg, resume=sys.argv[7] if len(sys.argv) > 7 else None)
    from posttrain.trainers.distributed import leave_process_group
    leave_process_group()  # gc, barrier, destroy: no teardown abort
""")


def test_fsdp_grpo_tail_average_is_the_mean_of_the_weights_and_resumes(tmp_path, one):
    """grpo --fsdp --average-last 2 --average-every 2 on 2 processes (4 steps): model/ is the mean of the weights at
    steps 2 and 4 of the same run without averaging (its step-2 shards, consolidated, and its model/: the oracle),
    and a run resumed from the averaged run's step-2 shards, whose DCP carries the running sum, ends the same."""
    import shutil

    from posttrain.trainers.sharded import consolidate

    init = str(one / "model")
    avg = _run_script(AVG_SCRIPT, tmp_path, 2, "avg", init, "2")
    last = _run_script(AVG_SCRIPT, tmp_path, 2, "last", init, "1")
    assert json.loads((avg / "summary.json").read_text())["weight_average_steps"] == [2, 4]
    w2 = load_file(consolidate(last / "checkpoints" / "step-00000002", tmp_path / "c2") / "model.safetensors")
    w4 = load_file(last / "model" / "model.safetensors")
    final = load_file(avg / "model" / "model.safetensors")
    assert final.keys() == w2.keys() == w4.keys()
    for k in final:
        torch.testing.assert_close(final[k], (w2[k] + w4[k]) / 2, atol=1e-5, rtol=1e-5, msg=k)
    assert any((w2[k] - w4[k]).abs().max() > 1e-3 for k in final)  # two different weights were averaged
    resumed = tmp_path / "resumed"
    shutil.copytree(avg, resumed)
    shutil.rmtree(resumed / "model")
    (resumed / "checkpoints" / "latest").write_text("step-00000002\n")
    _run_script(AVG_SCRIPT, tmp_path, 2, "resumed", init, "2", str(resumed / "checkpoints" / "step-00000002"))
    again = load_file(resumed / "model" / "model.safetensors")
    for k in final:
        torch.testing.assert_close(again[k], final[k], atol=1e-5, rtol=1e-5, msg=k)
