"""Run directories: one run per directory, identified by a run id, and the checkpoints that belong to it.

A run directory (``--out``) holds::

    run.json                 {"run_id", "trainer", "created", "posttrain_version"}: written when the run starts
    config.resolved.yaml     the config the run (last) started with; also .json
    metrics.jsonl, summary.json, pairs.jsonl, ...
    checkpoints/step-NNNNNNNN/  checkpoints/latest      periodic checkpoints (see checkpoint.py)
    model/                   the final model

Every checkpoint's ``trainer_state.json`` records ``run_id`` and ``trainer``. The rules:

- a new run needs an empty (or new) ``--out``; a non-empty one is refused unless ``--overwrite`` (which
  deletes its contents: only a directory that looks like a run, i.e. has ``run.json`` or
  ``config.resolved.json``, and never an ``--init``/``--data`` inside it; symlinks in it are unlinked,
  never followed) or ``--resume``;
- except a run of the same trainer that stopped before its first checkpoint (:func:`unstarted`: ``run.json``, no
  ``checkpoints/step-*``, no ``model/``, no ``summary.json``): there is nothing to continue, so the same command
  starts it again from step 0 with a new run id, and on the command line ``--resume`` of it does too, with its saved
  configuration. Only the files a run writes before its first checkpoint (:data:`RUN_OUTPUTS`) are replaced;
  anything else in the directory stays;
- ``--resume DIR`` continues the run in DIR's run directory (DIR, or the run holding the checkpoint DIR)
  and writes there: ``--out`` defaults to it and may not name another directory. Only checkpoints whose
  run id is the one in ``run.json`` are candidates (a stale ``model/`` of an older run is ignored, with a
  warning); the newest by step wins. Without ``run.json`` (an older layout, or checkpoints copied in by
  hand) the checkpoints must agree on one run id, which is then adopted (a checkpoint without one is
  given a new id, recorded in its ``trainer_state.json`` and in ``run.json``). ``run.json``'s trainer must be
  the resuming command's. On the command line the resumed run's config is its own saved one
  (:func:`resume_config`): only flags given explicitly may differ, and only those of :data:`RESUME_MAY_CHANGE`
  (length, cadence, logging); through the Python API changed settings are listed in a warning;
- nothing is written into ``--out`` (no clearing, no ``run.json``, no ``config.resolved.*``) until the
  trainer has validated its inputs and calls :func:`begin_run`; a failed start leaves the directory as it was;
- ``checkpoints/latest`` must name ``step-NNNNNNNN`` in the same directory: anything else (``../../etc``, an
  absolute path, a symlink) is ignored with a warning and the newest complete ``step-*`` is used;
- leftovers of killed writers (``.NAME.XXXXXXXX.tmp``, ``NAME.old`` beside a complete ``NAME``) are removed
  when a run resumes in the directory.

One writer at a time: from :func:`begin_run` on, the process holds an exclusive lock on the directory
(:mod:`posttrain.run_lock`); a second run into it, or a ``--resume``/``--overwrite`` of it, is refused with one line
naming the holder's pid, before anything is read or cleaned. The lock goes with the process (``kill -9``
included), so a resume is never blocked by a dead writer.

Not handled: run ids across copies of a run
directory (a copy keeps the id: resuming the copy continues the same run, which is what a copy means).

This module imports no torch, so the CLI can use :func:`resume_out` while parsing flags.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from posttrain import __version__, run_lock
from posttrain import config as C
from posttrain.checkpoints.layout import (
    RUN_FILE,
    STATE_FILE,
    checkpoint_state,
    find_checkpoint,
    is_checkpoint,
    read_json_file,
    read_run,
    warn,
)
from posttrain.data.io import atomic_write_json, atomic_write_text, clean_stale_temps, recover_dir
from posttrain.errors import UserError
from posttrain.trainers import distributed
from posttrain.trainers.engine.registry import command_of

RUN_OUTPUTS = (
    RUN_FILE,
    "config.resolved.yaml",
    "config.resolved.json",
    "metrics.jsonl",
    "tensorboard",
    "wandb",
    "pairs.jsonl",
    "pairs.meta.json",
    "eval_pairs.jsonl",
    "eval_pairs.meta.json",
)
"""What a run writes into its directory before its first checkpoint (run files, metrics and its sinks, the preference
pairs cached by ``rm``/``dpo``): removed when a run that stopped before its first checkpoint starts again there
(:func:`unstarted`), so the new start is the one an empty directory would give. A file a trainer adds to that moment
belongs here; any other entry is the user's and is kept."""
SAVED = ("model", "model.old", "summary.json", "restarts")
"""Entries that mean a run got past its start: a final model, a summary (``rm --eval-only`` writes only that), the
runs of ``sft --restarts``."""
RESUME_MAY_CHANGE = (
    "out",
    "progress",
    "threads",
    "logger",
    "steps",
    "eval_every",
    "save_every",
    "keep_checkpoints",
    "fsdp",
    "device",
    "grad_checkpointing",
    "compile",
    "restart_jobs",
)
"""Config fields that may differ on resume without a warning (outputs, logging, length, checkpoint cadence, sharding,
the device, activation checkpointing, compilation, restarts trained at a time: the same update; checkpoints are device-free). On the command line (:func:`resume_config`) these are the only flags ``--resume`` accepts with a
value other than the run's own; every other field (data, model, loss, batch size, learning rate, seed...) changes
what the run trains, and is refused."""


# ---------------------------------------------------------------------------------------------
# starting a run


def run_root(resume: str | Path) -> Path:
    """The run directory ``--resume`` continues: DIR itself, or the run holding checkpoint DIR."""
    p = Path(resume)
    if not p.exists() and not p.with_name(p.name + ".old").is_dir():
        raise UserError(f"checkpoint not found: {p}")
    if not is_checkpoint(recover_dir(p)):
        return p
    if p.parent.name == "checkpoints":
        return p.parent.parent
    if p.name == "model":
        return p.parent
    raise UserError(
        f"--resume {p}: a checkpoint outside a run directory; --resume takes a run directory (or a "
        f"checkpoint inside one), --init {p} starts a new run from its weights"
    )


def saved_config(root: Path) -> tuple[dict, Path]:
    """The config the run in ``root`` last started with (``config.resolved.json``), else, for an older layout,
    the one recorded in its newest checkpoint's ``trainer_state.json``; and the file it came from."""
    f = root / "config.resolved.json"
    if f.is_file():
        return read_json_file(f, "config file"), f
    ckpt = find_checkpoint(root, prefer_latest=True)
    cfg = checkpoint_state(ckpt).get("config")
    if not isinstance(cfg, dict):
        raise UserError(f"{root} holds no saved configuration (no config.resolved.json): start a new run with --out")
    return cfg, ckpt / STATE_FILE


def _known(cls, d: dict, where: Path, prefix: str = "") -> dict:
    """``d`` without the keys ``cls`` no longer has (each named in a warning); nested configs likewise."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    out = {}
    for k, v in d.items():
        f = fields.get(k)
        if f is None:
            warn(f"{where}: ignoring the saved setting {prefix}{k} (not a setting of this version)")
            continue
        tp = C._hints(cls)[k]
        out[k] = _known(tp, v, where, f"{prefix}{k}.") if C._is_dataclass_type(tp) and isinstance(v, dict) else v
    return out


def _trainer_of(root: Path) -> tuple[str | None, bool]:
    """The trainer that made the run in ``root`` (``run.json``, else its newest checkpoint), and whether
    ``run.json`` said so."""
    info = read_run(root)
    if info is not None:
        return info.get("trainer"), True
    return checkpoint_state(find_checkpoint(root, prefer_latest=True)).get("trainer"), False


def resume_config(
    cls, resume: str | Path, file: str | Path | None = None, flags: dict | None = None, command: str | None = None
):
    """The config ``--resume DIR`` continues with: the run's own saved config (:func:`saved_config`), and on top
    only what the command line gives explicitly (``file``: a ``--config`` file; ``flags``: the flags' values).

    The rule: a resumed run is the run that was started. Flags that only change how long it runs, how often it
    evaluates, saves and logs, and where it prints (:data:`RESUME_MAY_CHANGE`) may differ, and each difference is
    printed; any other difference (data, model, loss, batch size, learning rate, seed, ...) is an error naming
    each, since the result would no longer be the run's. No preset applies: the saved config is already resolved.
    Example: a run saved with ``steps: 300, batch_size: 8``; ``--resume R --steps 400`` -> steps 400 (a note),
    ``--resume R --batch-size 64`` -> "error: ... batch_size 8 -> 64 ...".
    """
    root = run_root(resume)
    trainer, from_run_file = _trainer_of(root)
    if command is not None and trainer is not None and command_of(trainer).split()[0] != command:
        if not from_run_file:  # an older layout: the checkpoint's own check names it (and --init)
            return C.build_config(cls, None, file, flags)
        raise UserError(
            f"{root} is a `posttrain {command_of(trainer)}` run: `posttrain {command} --resume` continues only its "
            f"own runs"
        )
    saved, where = saved_config(root)
    cfg = C.build_config(cls, _known(cls, saved, where), file, flags)
    changes = [c for c in changed_settings(saved, cfg, ignore=("out",))]
    refused = [c for c in changes if c.split(" ", 1)[0].split(".")[0] not in RESUME_MAY_CHANGE]
    if refused:
        may = ", ".join(C.flag_name(n) for n in RESUME_MAY_CHANGE if n != "out")
        raise UserError(
            f"--resume {resume} continues the run with its own configuration ({where}); these flags would change "
            f"what it trains: {'; '.join(refused)}. On resume only {may} may differ: drop the others, or start a "
            f"new run with --out"
        )
    if changes:
        print(f"note: resuming with changed settings: {'; '.join(changes)} (the rest as saved in {where})")
    return cfg


def unstarted(root: Path, trainer: str | None = None) -> dict | None:
    """``run.json`` of the run in ``root`` when that run stopped before its first checkpoint (and, given ``trainer``,
    was that trainer's), else None: ``run.json`` readable, none of :data:`SAVED`, and ``checkpoints/`` absent or
    holding only what a writer killed mid-save leaves (``.NAME.XXXXXXXX.tmp``).

    Example: a ``grpo`` run whose reward raised on batch 1 left ``run.json``, ``config.resolved.*`` and a step-0 line
    in ``metrics.jsonl`` -> its run.json; the same after ``checkpoints/step-00000001`` was written -> None."""
    root = Path(root)
    if not root.is_dir() or any((root / name).exists() or (root / name).is_symlink() for name in SAVED):
        return None
    ckpts = root / "checkpoints"
    if ckpts.is_symlink() or (ckpts.exists() and not ckpts.is_dir()):
        return None
    if ckpts.is_dir() and any(not (e.name.startswith(".") and e.name.endswith(".tmp")) for e in ckpts.iterdir()):
        return None
    try:
        info = read_run(root)
    except UserError:  # a corrupt run.json: not a run to restart silently
        return None
    if info is None or (trainer is not None and info.get("trainer") != trainer):
        return None
    return info


def restart_unstarted(resume: str | Path | None) -> str | Path | None:
    """CLI: ``--resume DIR`` of a run that stopped before its first checkpoint (:func:`unstarted`) -> None: the run
    starts again from step 0 in DIR, with its saved configuration (which :func:`resume_config` gave); :func:`begin_run`
    says so. Any other ``resume`` as it is."""
    if resume and unstarted(run_root(resume)) is not None:
        return None
    return resume


def resume_out(args) -> dict:
    """CLI: with ``--resume DIR`` and no ``--out`` flag, the outputs go to DIR's run directory."""
    resume = getattr(args, "resume", None)
    if not resume or "cfg:out" in vars(args):
        return {}
    return {"out": str(run_root(resume))}


@dataclass
class Run:
    """A run about to start in ``dir``: fresh (``resume_from`` None) or resuming checkpoint ``resume_from``."""

    dir: Path
    run_id: str
    trainer: str
    resume_from: Path | None = None
    resume_state: dict = dataclasses.field(default_factory=dict)
    clear: bool = False  # --overwrite: delete dir's contents at begin_run
    restart: bool = False  # dir holds a run that stopped before its first checkpoint: its RUN_OUTPUTS go at begin_run
    info: dict | None = None  # the existing run.json, when resuming
    lock: run_lock.DirLock | None = None  # held from begin_run on, while this run writes dir


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(4)


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _inside(a: Path, b: Path) -> bool:
    a, b = a.resolve(), b.resolve()
    return a == b or b in a.parents


def open_run(cfg, trainer: str, resume: str | Path | None = None, overwrite: bool = False) -> Run:
    """Check ``cfg.out`` for a new run or a resume of ``resume``; writes nothing but cleans a resumed run's temps.

    Under ``torchrun`` every rank checks (and fails) alike, and all take rank 0's run id."""
    run = _open_run(cfg, trainer, resume, overwrite)
    w = distributed.world()
    if w.distributed:
        run = dataclasses.replace(run, run_id=distributed.broadcast_object(run.run_id, w))
    return run


def _open_run(cfg, trainer: str, resume: str | Path | None, overwrite: bool) -> Run:
    out = Path(cfg.out)
    if resume is not None and overwrite:
        raise UserError(
            "--resume and --overwrite exclude each other: --resume continues a run, --overwrite "
            "replaces it with a new one"
        )
    if resume is not None:
        root = run_root(resume)
        if distributed.world().is_main:
            run_lock.check_free(root)  # another process writing it: say so before cleaning its temps
        info = read_run(root)
        if info is not None and info.get("trainer") != trainer:
            raise UserError(
                f"{root} is a `posttrain {command_of(info.get('trainer'))}` run: `posttrain "
                f"{command_of(trainer)} --resume` continues only its own runs"
            )
        for d in (root, root / "checkpoints"):
            clean_stale_temps(d)
        ckpt = find_checkpoint(resume, prefer_latest=True, run_id=info["run_id"] if info else None)
        if not _same(out, root):
            raise UserError(
                f"--resume {resume} continues the run in {root} and writes there, not to --out {out}: drop --out"
            )
        state = checkpoint_state(ckpt)
        run_id = info["run_id"] if info else state.get("run_id") or new_run_id()
        return Run(dir=root, run_id=run_id, trainer=trainer, resume_from=ckpt, resume_state=state, info=info)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if distributed.world().is_main:
        run_lock.check_free(out)
    entries = sorted(e.name for e in out.iterdir()) if out.is_dir() else []
    if entries and not overwrite and unstarted(out, trainer) is not None:
        return Run(dir=out, run_id=new_run_id(), trainer=trainer, restart=True)
    if entries and not overwrite:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserError(
            f"--out {out} is not empty (it holds {shown}): pass --overwrite to delete it and start a "
            f"new run there, or --resume {out} to continue the run in it"
        )
    if entries:
        if not ((out / RUN_FILE).is_file() or (out / "config.resolved.json").is_file()):
            raise UserError(
                f"--overwrite refuses to clear {out}: it is not a posttrain run directory (no {RUN_FILE}); "
                f"empty it yourself or choose another --out"
            )
        for name in ("init", "data", "eval_data"):
            value = getattr(cfg, name, None)
            if value and Path(value).exists() and _inside(Path(value), out):
                raise UserError(
                    f"--{name.replace('_', '-')} {value} lies inside --out {out}, which --overwrite "
                    f"clears: choose another --out"
                )
    return Run(dir=out, run_id=new_run_id(), trainer=trainer, clear=bool(entries))


def _remove(entry: Path) -> None:
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()


def clear_dir(d: Path) -> None:
    """Delete the contents of ``d``; symlinks are unlinked, never followed."""
    for entry in d.iterdir():
        _remove(entry)


def clear_unstarted(d: Path) -> list[str]:
    """Remove what a run that stopped before its first checkpoint wrote in ``d`` (:data:`RUN_OUTPUTS`, killed writers'
    temps, an empty ``checkpoints/``); symlinks are unlinked, never followed. Returns the names removed."""
    removed = clean_stale_temps(d)
    for name in RUN_OUTPUTS:
        if (d / name).exists() or (d / name).is_symlink():
            _remove(d / name)
            removed.append(name)
    ckpts = d / "checkpoints"
    if ckpts.is_dir() and not ckpts.is_symlink():
        clean_stale_temps(ckpts)
        if not any(ckpts.iterdir()):
            ckpts.rmdir()
            removed.append("checkpoints")
    return removed


_MISSING = object()


def _get(d, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return _MISSING
        d = d[part]
    return d


def changed_settings(old: dict, cfg, ignore=RESUME_MAY_CHANGE) -> list[str]:
    """``name: old -> new`` for each config field of ``cfg`` whose value differs from the saved config ``old``."""
    new = json.loads(json.dumps(dataclasses.asdict(cfg), default=str))  # tuples -> lists, as saved
    out = []
    for name, _, _ in C.leaf_fields(type(cfg)):
        if name in ignore or name.split(".")[0] in ignore:
            continue
        was, now = _get(old, name), _get(new, name)
        if was is not _MISSING and was != now:
            out.append(f"{name} {was!r} -> {now!r}")
    return out


def begin_run(run: Run, cfg) -> Path:
    """Call once the inputs are validated: clear (``--overwrite``), write ``run.json`` (new runs, or a resumed
    directory without one) and ``config.resolved.*``; warn about settings changed since the resumed checkpoint.
    Under ``torchrun`` rank 0 writes and the others wait for it."""
    w = distributed.world()
    if not w.is_main:
        distributed.barrier(w)  # rank 0 clears and writes the directory first
        return run.dir
    out = _begin_run(run, cfg)
    distributed.barrier(w)
    return out


def _begin_run(run: Run, cfg) -> Path:
    out = run.dir
    out.mkdir(parents=True, exist_ok=True)
    run.lock = run.lock or run_lock.lock_dir(out)  # one writer: held while this run (this Run object) lives
    if run.clear:
        clear_dir(out)
    if run.restart:
        removed = clear_unstarted(out)
        kept = sorted(e.name for e in out.iterdir())
        print(
            f"note: {out} held a run that stopped before its first checkpoint: starting it again from step 0 (removed "
            f"its {', '.join(sorted(removed)) or 'nothing'}{'; kept ' + ', '.join(kept) if kept else ''})"
        )
    new = C.resolved_dict(cfg)  # less the settings nothing reads (the embedded task's, on the user's data)
    if run.resume_from is not None:
        old = run.resume_state.get("config")
        if not isinstance(old, dict) and (out / "config.resolved.json").is_file():
            old = read_json_file(out / "config.resolved.json", "config file")
        changes = changed_settings(old, cfg) if isinstance(old, dict) else []
        if changes:
            warn(
                f"resuming {run.resume_from} with changed settings: {'; '.join(changes)} "
                f"(the result will differ from an uninterrupted run)"
            )
    if run.resume_from is not None and run.info is None and "run_id" not in run.resume_state:
        # an older layout: the checkpoint resumed from joins the run id this directory now gets
        atomic_write_json(run.resume_from / STATE_FILE, {**run.resume_state, "run_id": run.run_id})
    if run.info is None:
        atomic_write_json(
            out / RUN_FILE,
            {
                "run_id": run.run_id,
                "trainer": run.trainer,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "posttrain_version": __version__,
            },
        )
    atomic_write_text(out / "config.resolved.yaml", C.resolved_yaml(cfg))
    atomic_write_json(out / "config.resolved.json", new)
    return out
