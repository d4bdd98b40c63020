"""SFT restarts: R runs from different initialisations, the one with the best validation accuracy kept.

Key insight: on a few hundred demonstrations the held-out accuracy of one SFT run is a lottery over its
initialisation and batch order (0.12-0.43 over seeds 0-4 on the embedded task, same data: docs/outcomes.md),
while checkpoints *within* a run differ little. Greedy accuracy on the task's dev split (problems that are neither
demonstrations, nor RL prompts, nor held out) ranks runs almost exactly as held-out accuracy does, so R restarts
ranked on it keep a good draw at R times the cost (R x ~30 s CPU on the tiny preset):

    seed_0 = seed;  seed_k = blake2b("sft-restart:{seed}:{k}") mod 2^31      (k = 1 .. R-1)
    run k      = posttrain sft --seed seed_k --out OUT/restarts/k            (an ordinary SFT run each)
    val_k      = greedy accuracy of run k's model/ on the validation problems
    k*         = argmax_k val_k (the earliest on ties);  OUT/model/ = run k*'s model/

Validation problems: ``--val-data FILE`` ({prompt, answer} problems; a prompt that is also a demonstration is a
``file:line`` error, since ranking on trained prompts keeps the best memoriser, and so is one of the embedded task's
held-out problems, since ranking on them selects on the reported numbers); else, on the embedded task,
``val_problems`` problems of the task's *dev* split (a fixed sample, the same for every seed: all of it by default;
never trained on, disjoint from the demonstrations and the RL prompts); the held-out split is never looked at. With ``--data`` and no ``--val-data`` each run's own
``val_fraction`` split of the demonstrations is used, so ``val_fraction > 0`` is required (without either, and
from ``--init`` / ``--model``, ``train_sft`` runs once and says so: restarts are for a fresh model). ``restarts = 1`` is exactly a plain run (seed_0 = seed).

Successive halving (``restart_probe`` f, P = round(f · steps), ``restart_keep`` K; Jamieson & Talwalkar 2016): every restart trains
to step P only (a resumable checkpoint there, its score in ``restarts/k/probe.json``), the K best on the validation
problems at P train on to the end (resumed, so each ends bitwise as an uninterrupted run), and the best of those at
the end is kept: R candidates for R·P + K·(steps − P) steps instead of R·steps. The rank at P is a noisy guess at
the rank at the end: on the embedded tasks' default (4 restarts, P at half the steps) it keeps the restart that ends
best on dev on 2 seeds of 5, and finishing all four would gain 2-5 test points of SFT at 1.6x the steps; no earlier
P measured did better on both tasks (``benchmarks/bench_restart_probe.py``, docs/log/2026-12-07-where-to-rank-sft-restarts.md).

Resume: each restart is its own run directory; ``--resume OUT`` skips the finished ones (a ``summary.json``),
resumes an interrupted one from its checkpoint, and starts the rest, so it ends as an uninterrupted run would.

Under ``torchrun`` the restarts run one after another, each on all the processes (an ordinary distributed SFT run
each); every process scores the restarts the same way, and rank 0 alone writes the probe records, the kept
``model/`` and the summary (the others wait for it).

In parallel (``restart_jobs`` J > 1, or 0, the default: as many as the usable cores hold at ``threads`` threads
each, ``restart_workers.py``): the restarts of a phase (the probes, then the finalists) train J at a time, each in a
spawned worker process that dies with its parent, its output in ``restarts/K.log``; the parent shows their progress,
ranks and scores them. A restart is a function of its config alone, so each ends bit for bit as it would one at a
time (tested), in about 1/J of the wall time on J free cores.

Not handled: parallel restarts under ``torchrun`` (there they run one after another), restarts under ``--fsdp``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import shutil
import time
from pathlib import Path

from posttrain.checkpoints.files import read_json
from posttrain.checkpoints.layout import read_json_file, read_run
from posttrain.checkpoints.load import load_checkpoint
from posttrain.data.conversations import load_sft_data
from posttrain.data.io import atomic_dir, atomic_write_json
from posttrain.data.pairs import load_pairs
from posttrain.errors import ConfigError, DataError, UserError
from posttrain.evaluation import evaluate_problems
from posttrain.tasks.embedded import embedded_task, split_of
from posttrain.trainers import common, distributed
from posttrain.trainers.restart_workers import auto_jobs, run_phase
from posttrain.trainers.run_dir import begin_run, changed_settings, run_root

VAL_SAMPLE_SEED = "sft-restart-validation"
STATE_FILE = "trainer_state.json"  # in a checkpoint (trainers/checkpoint.py)
PROBE_FILE = "probe.json"  # a restart's score at the probe step
RESUMABLE = ("out", "progress", "threads", "logger", "restart_jobs")  # what --resume of a restarts run may change


def restart_seed(seed: int, k: int) -> int:
    """Restart ``k``'s seed: ``seed`` itself for k = 0, else a hash of (seed, k) (no clash with other seeds'
    restart 0, as ``seed + k`` would give)."""
    if k == 0:
        return seed
    h = hashlib.blake2b(f"sft-restart:{seed}:{k}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") % 2**31


def plan(cfg, resume: str | None):
    """``(cfg, restarts)``: whether ``train_sft`` runs restarts (``restarts`` > 1, or ``--resume`` of a restarts
    run), else the config of its one plain run. ``--resume`` of a plain run continues that run; restarts are for a
    fresh model on the embedded task, or on ``--data`` with ``--val-data`` or ``--val-fraction`` to rank on: anywhere
    else one run trains, and says so."""
    resumes_restarts = bool(resume) and (read_run(run_root(resume)) or {}).get("trainer") == "sft_restarts"
    if resume and not resumes_restarts:
        cfg = dataclasses.replace(cfg, restarts=1)
    elif (
        cfg.restarts > 1
        and not resume
        and (cfg.init or cfg.model_path or (cfg.data and not (cfg.val_fraction or cfg.val_data)))
    ):
        print(
            f"restarts={cfg.restarts} applies to a fresh model on the embedded task (or --data with --val-data or "
            "--val-fraction to rank on): one run here"
        )
        cfg = dataclasses.replace(cfg, restarts=1)
    return cfg, cfg.restarts > 1 or resumes_restarts


def check_config(cfg) -> None:
    """The restarts fields of an SFTConfig (called by its ``__post_init__``)."""
    if cfg.restarts > 1 and cfg.fsdp:
        raise ConfigError("restarts > 1 with fsdp is not supported (restarts run one after another in one process)")
    if cfg.restarts > 1 and cfg.restart_probe and cfg.restart_keep > cfg.restarts:  # one run ignores halving
        raise ConfigError(f"restart_keep={cfg.restart_keep} is more than restarts={cfg.restarts}")


def probe_step(cfg) -> int:
    """The step successive halving ranks restarts at (0 = no probe: too few steps, or ``restart_probe`` 0)."""
    step = round(cfg.restart_probe * cfg.steps)
    return step if 0 < step < cfg.steps else 0


def validation_problems(cfg) -> list[tuple[str, str]]:
    """The problems restarts are ranked on: ``cfg.val_data``'s, or the embedded task's dev split, a fixed sample of
    ``cfg.val_problems`` of them (sorted pool, seeded sampler: the same on every seed and machine; the whole split
    when it has no more problems than that)."""
    task = embedded_task(cfg.task)
    if cfg.val_data:
        return _file_problems(cfg, task)
    pool = sorted(task.dev_set())
    return random.Random(VAL_SAMPLE_SEED).sample(pool, min(cfg.val_problems, len(pool)))


def _file_problems(cfg, task) -> list[tuple[str, str]]:
    val = load_pairs(cfg.val_data, "validation", on_bad_line=cfg.on_bad_line)
    if cfg.data:
        trained = {d[0] for d in load_sft_data(cfg.data, on_bad_line=cfg.on_bad_line) if isinstance(d, tuple)}
    else:
        trained = {p.prompt for p in task.demonstrations()}
    for i, (prompt, _) in enumerate(val):
        if prompt in trained:
            raise DataError(
                f"{val.where(i)}: prompt {prompt!r} is also a training demonstration; restarts ranked on "
                f"trained prompts keep the best memoriser, not the best generaliser"
            )
        if not cfg.data and split_of(prompt, cfg.task) == "test":
            raise DataError(
                f"{val.where(i)}: prompt {prompt!r} is one of the embedded task's held-out (test) problems; restarts "
                f"ranked on them select on the numbers that are reported: rank on its dev split (no --val-data)"
            )
    return list(val)


def _open(cfg, resume, overwrite: bool) -> Path:
    """The restarts run's directory: a new one through the trainers' own ``open_run``/``begin_run`` (the same
    non-empty / ``--overwrite`` rules, ``run.json``, ``config.resolved.*``), or ``resume``'s, whose saved config
    must equal this one (a changed restart would rank unlike runs)."""
    if resume is None:
        run = common.open_run(cfg, "sft_restarts", overwrite=overwrite)
        return begin_run(run, cfg)
    root = Path(resume)
    info = read_run(root)
    if info is None or info.get("trainer") != "sft_restarts":
        raise UserError(f"--resume {resume}: not a `posttrain sft --restarts` run directory (no run.json of one)")
    changes = changed_settings(read_json_file(root / "config.resolved.json", "config file"), cfg, ignore=RESUMABLE)
    if changes:
        raise UserError(
            f"--resume {resume}: the configuration differs from the run's in {'; '.join(changes)}; "
            f"start a new run (--out) or --overwrite"
        )
    return root


_NUMBER = (int, float)
SUMMARY_KEYS = {
    "heldout_accuracy": _NUMBER,
    "train_seconds": _NUMBER,
    "val_n": int,
    "best_val_accuracy": (*_NUMBER, type(None)),
}
"""What a restart's ``summary.json`` must hold to be reused on resume (else a one-line error naming the file)."""
PROBE_KEYS = {"step": int, "val_accuracy": _NUMBER, "val_n": int, "train_seconds": _NUMBER}


def _run_one(sub, train_sft, pause_at: int | None = None) -> dict:
    """One restart: done (its summary), interrupted (resume from its checkpoint) or new; with ``pause_at``, trained
    (or resumed) up to that step only and left resumable there."""
    d = Path(sub.out)
    done = (d / "summary.json").is_file()
    resumable = not done and (d / "checkpoints").is_dir() and any((d / "checkpoints").iterdir())
    exists = d.exists()
    distributed.barrier(distributed.world())  # every rank decides on the same files before rank 0 writes any
    if done:
        return read_json(d / "summary.json", "summary", SUMMARY_KEYS)
    if resumable:
        return train_sft(sub, resume=str(d), pause_at=pause_at)
    return train_sft(sub, overwrite=exists, pause_at=pause_at)


def _score(model_dir: Path, val, max_new_tokens: int) -> float:
    distributed.barrier(distributed.world())  # rank 0 has written the checkpoint (a paused run's too)
    ck = load_checkpoint(model_dir)
    return evaluate_problems(ck.model, ck.tokenizer, val, max_new_tokens=max_new_tokens, window=None).accuracy


def _probe(sub, train_sft, cfg, val) -> dict:
    """Successive halving's first rung: restart ``sub`` trained to the probe step and scored there
    (``probe.json`` in its directory, so a resumed restarts run does not train or score it again)."""
    path = Path(sub.out) / PROBE_FILE
    if path.is_file():
        return read_json(path, "probe record", PROBE_KEYS)
    t0 = time.perf_counter()
    step = probe_step(cfg)
    s = _run_one(sub, train_sft, pause_at=step)
    ck = Path(sub.out) / ("model" if "paused_at" not in s else f"checkpoints/step-{step:08d}")
    probe = {
        "step": step,
        "val_accuracy": _score(ck, val, cfg.max_new_tokens),
        "val_n": len(val),
        "train_seconds": s.get("train_seconds", time.perf_counter() - t0),
    }
    if distributed.world().is_main:
        atomic_write_json(path, probe)
    return probe


def train_restarts(cfg, train_sft, resume=None, overwrite: bool = False) -> dict:
    """Run ``cfg.restarts`` SFT runs and keep the best by validation accuracy; returns the summary. With
    ``restart_probe``, every restart trains to that fraction of the steps, and only the best ``restart_keep`` finish."""
    t0 = time.perf_counter()
    world = distributed.init()  # under torchrun: every restart runs on all the processes, one after another
    val = validation_problems(cfg) if cfg.val_data or not cfg.data else None  # None: each run's val_fraction split
    out = _open(cfg, resume, overwrite)  # after the inputs are checked: a bad --val-data writes nothing
    subs = [
        dataclasses.replace(
            cfg, restarts=1, restart_jobs=1, seed=restart_seed(cfg.seed, k), out=str(out / "restarts" / str(k))
        )
        for k in range(cfg.restarts)
    ]
    finalists, probes, probe = range(cfg.restarts), {}, probe_step(cfg)
    if probe and val is None:
        print("restart_probe ranks on problems (--val-data); with a val_fraction split every restart finishes")
    if cfg.restart_jobs > 1 and world.distributed:
        print(
            f"restart_jobs={cfg.restart_jobs}: under torchrun the restarts run one after another, each on every process"
        )
    if probe and val is not None:
        to_probe = lambda k, sub: f"{k + 1}/{cfg.restarts} (seed {sub.seed}) to step {probe} -> {sub.out}"  # noqa: E731
        jobs = auto_jobs(cfg, cfg.restarts, probe, world)
        probes = run_phase(_probe, dict(enumerate(subs)), jobs, to_probe, (0, probe), train_sft, cfg, val)
        for k in sorted(probes):
            print(f"  restart {k}: validation accuracy {probes[k]['val_accuracy']:.3f} at step {probes[k]['step']}")
        ranked = sorted(probes, key=lambda k: (-probes[k]["val_accuracy"], k))  # the earliest on ties
        finalists = sorted(ranked[: cfg.restart_keep])
        print(f"finishing restart{'s' if len(finalists) > 1 else ''} {', '.join(map(str, finalists))}")
    to_end = lambda k, sub: f"{k + 1}/{cfg.restarts} (seed {sub.seed}) -> {sub.out}"  # noqa: E731
    start = probe if probes else 0  # the finalists resume from their probe checkpoints
    jobs = auto_jobs(cfg, len(finalists), cfg.steps - start, world)
    finished = run_phase(_run_one, {k: subs[k] for k in finalists}, jobs, to_end, (start, cfg.steps), train_sft)
    candidates = []
    for k, sub in enumerate(subs):
        c = {"restart": k, "seed": sub.seed, "dir": sub.out, "probe": probes.get(k)}
        if k not in finalists:
            candidates.append({**c, "finished": False, "train_seconds": probes[k]["train_seconds"]})
            continue
        s = finished[k]
        if val is None:
            score, n = s["best_val_accuracy"], s["val_n"]
        else:
            score, n = _score(Path(sub.out) / "model", val, cfg.max_new_tokens), len(val)
        seconds = s["train_seconds"] + (probes[k]["train_seconds"] if k in probes else 0.0)
        c.update(val_accuracy=score, val_n=n, heldout_accuracy=s["heldout_accuracy"], train_seconds=seconds)
        candidates.append({**c, "finished": True})
        print(f"  restart {k}: validation accuracy {score:.3f} ({n} problems)")
    done = [c for c in candidates if c["finished"]]
    best = max(done, key=lambda c: (c["val_accuracy"], -c["restart"]))  # the earliest on ties
    if world.is_main:
        with atomic_dir(out / "model") as tmp:  # the kept restart's model/, as a checkpoint of this run
            shutil.copytree(Path(best["dir"]) / "model", tmp, dirs_exist_ok=True)
            state = read_json(tmp / STATE_FILE, "checkpoint file")
            run_id = read_run(out)["run_id"]
            atomic_write_json(tmp / STATE_FILE, {**state, "run_id": run_id, "restart": best["restart"]})
    distributed.barrier(world)
    chosen = read_json(Path(best["dir"]) / "summary.json", "summary", SUMMARY_KEYS)
    summary = {
        **chosen,
        "restarts": cfg.restarts,
        "restart_probe_step": probe,
        "selected_restart": best["restart"],
        "selected_seed": best["seed"],
        "restart_val_accuracy": best["val_accuracy"],
        "restart_val_n": best["val_n"],
        "candidates": candidates,
        "model_dir": str(out / "model"),
        "train_seconds": sum(c["train_seconds"] for c in candidates),
        "wall_seconds": time.perf_counter() - t0,
    }
    path = common.write_summary(out, summary)
    print(
        f"kept restart {best['restart']} (validation {best['val_accuracy']:.3f}): held-out accuracy "
        f"{best['heldout_accuracy']:.3f}\nsummary: {path}\nmodel:   {out / 'model'}"
    )
    return summary
