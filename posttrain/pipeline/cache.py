"""Stage keys by content, and the files that say a stage is done.

A stage's key is the SHA-256 of one canonical JSON object (sorted keys, no whitespace)::

    {"stage": NAME, "config": <resolved config, EXCLUDED fields dropped>, "inputs": {label: digest of the bytes},
     "deps": {stage: key}, "seed": N, "posttrain": __version__, "code": <digest of posttrain's .py files>,
     "torch": torch.__version__}

Paths never enter a key (a moved run directory or a renamed input file keeps its keys); their contents do,
through ``inputs`` (a file's bytes; a directory's files, by relative name and bytes), and the keys of the
stages a stage reads from are chained into it, so a changed tokenizer changes every key after it. A
path-valued option of a stage's config (:data:`PATH_FIELDS`: ``[sft] init``, ``[grpo] reward_model``, ...) that
names an existing file or directory is keyed the same way, by its contents (``inputs.config.init``), not by the
path: an edited reward model re-runs the stages it scores, a moved one does not. ``code`` is
the package's own source (every ``.py`` file's relative name and bytes; :func:`code_digest`): the version number
alone let an edited trainer reuse the stages the old code had made, so a run mixed two codes without saying so.
Any edit, a comment's included, re-runs the stages (and never resumes across it): the price of never mixing.

``DONE.json`` in the stage directory ({key, fields, summary, wall_s, peak_rss_mb, finished, outputs, files}) is
written atomically and last: a stage with a ``DONE.json`` whose key matches *and whose outputs are still the ones
it wrote* is complete and skipped. ``outputs`` is the SHA-256 of every file the stage left in its directory
(:func:`manifest`; files under a ``checkpoints/`` directory are only listed, in ``files``: intermediate states,
which may be deleted to save space); :func:`verify` re-hashes them before a reuse, and a file edited, appended to
or deleted since (``sft/model`` removed, ``dedup/kept.jsonl`` grown) re-runs the stage, saying which in
``--explain``. Hashing reads every byte once per stage and invocation (about a second per GB). A stage that
started writes ``<run>/.pipeline/<stage>.json`` ({key, fields}) before it begins; a trainer stage whose
started key matches and whose directory holds a checkpoint resumes from it. Any other key clears the stage
directory first (never a silent resume of other settings). :func:`changed_fields` lists which key fields
differ, for ``--explain`` and for the line printed when a stage re-runs.

Two pipeline processes never write one run directory at once: the runner holds its lock
(:mod:`posttrain.run_lock`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import time
from pathlib import Path

from posttrain import __version__
from posttrain.data.io import atomic_write_json

DONE_FILE = "DONE.json"
STATE_DIR = ".pipeline"
EXCLUDED = frozenset(
    {
        "out",
        "init",
        "data",
        "eval_data",
        "val_data",
        "tokenizer",
        "logger",
        "threads",
        "workers",
        "restart_jobs",
        "progress",
        "backend",
        "ray_address",
        "rejects",
        "keep_checkpoints",
        "batch_size_dedup",
    }
)
"""Config fields that never enter a key: output and input paths (their contents do, as ``inputs``), logging,
worker and thread counts, progress display, checkpoint retention."""


def scrub(value, excluded=EXCLUDED):
    """A config (dataclass or dict) as plain JSON values, the ``excluded`` field names dropped at every level."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, dict):
        return {k: scrub(v, excluded) for k, v in value.items() if k not in excluded}
    if isinstance(value, (list, tuple)):
        return [scrub(v, excluded) for v in value]
    return value


def digest_file(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest_path(path: str | Path) -> str:
    """A file's bytes, or a directory's files (relative names and bytes, sorted; temp files skipped)."""
    p = Path(path)
    if p.is_file():
        return digest_file(p)
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file() and not x.name.endswith(".tmp")):
        h.update(str(f.relative_to(p)).encode() + b"\0" + digest_file(f).encode() + b"\n")
    return h.hexdigest()


PATH_FIELDS = ("init", "model_path", "reward_model", "value_init_path", "data", "eval_data", "val_data", "tokenizer")
"""A stage config's fields that name a file or directory: keyed by what they point to, not by the path."""


def path_inputs(config, inputs: dict[str, str | Path]) -> dict[str, Path]:
    """``config.FIELD -> path`` for each :data:`PATH_FIELDS` field of ``config`` (a dataclass or dict, top level)
    that names an existing path not already among ``inputs`` (by real path). E.g. ``[grpo] reward_model = "rm"``
    -> ``{"config.reward_model": Path("rm")}``; the SFT model a grpo stage starts from is already an input."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    elif isinstance(config, dict):
        values = config
    else:
        return {}
    seen = {os.path.realpath(v) for v in inputs.values()}
    out = {}
    for name in PATH_FIELDS:
        v = values.get(name)
        if isinstance(v, str) and v and os.path.exists(v) and os.path.realpath(v) not in seen:
            out[f"config.{name}"] = Path(v)
    return out


PACKAGE_DIR = Path(__file__).resolve().parent.parent  # posttrain/


@functools.cache
def code_digest(package_dir: Path = PACKAGE_DIR) -> str:
    """The posttrain source the stages run: every ``.py`` file under ``package_dir``, relative name and bytes."""
    h = hashlib.sha256()
    for f in sorted(package_dir.rglob("*.py")):
        if "__pycache__" not in f.parts:
            h.update(f.relative_to(package_dir).as_posix().encode() + b"\0" + digest_file(f).encode() + b"\n")
    return h.hexdigest()[:20]


def torch_version() -> str:
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a core dependency
        return "none"
    return torch.__version__


def key_fields(stage: str, config, inputs: dict[str, str | Path], deps: dict[str, str], seed: int) -> dict:
    """The object a key hashes (``inputs``: label -> path, digested here; the config's path-valued options that
    name existing paths are keyed by content, as ``inputs.config.FIELD``: :func:`path_inputs`)."""
    by_content = path_inputs(config, inputs)
    inputs = {**inputs, **by_content}
    return {
        "stage": stage,
        "config": scrub(config, EXCLUDED | {k.split(".", 1)[1] for k in by_content}),
        "inputs": {k: digest_path(v) for k, v in sorted(inputs.items())},
        "deps": dict(sorted(deps.items())),
        "seed": seed,
        "posttrain": __version__,
        "code": code_digest(),
        "torch": torch_version(),
    }


def key_of(fields: dict) -> str:
    blob = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def _flat(d, prefix: str = "") -> dict:
    if isinstance(d, dict):
        out = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


def changed_fields(old: dict | None, new: dict, limit: int = 6) -> list[str]:
    """``config.steps 40 -> 50``, ``inputs.corpus changed``, ``deps.sft changed``... (at most ``limit``)."""
    if not old:
        return ["no earlier run"]
    a, b = _flat(old), _flat(new)
    out = []
    for k in sorted(set(a) | set(b)):
        if a.get(k, "(absent)") == b.get(k, "(absent)"):
            continue
        if k.startswith(("inputs.", "deps.")):
            out.append(f"{k} changed")
        else:
            out.append(f"{k} {a.get(k, '(absent)')!r} -> {b.get(k, '(absent)')!r}")
    if len(out) > limit:
        out = out[:limit] + [f"... {len(out) - limit} more"]
    return out


def read_json(path: Path) -> dict | None:
    """The JSON object in ``path``, or None when missing or unreadable (a torn file counts as absent)."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return obj if isinstance(obj, dict) else None


def read_done(stage_dir: Path) -> dict | None:
    return read_json(stage_dir / DONE_FILE)


def started_file(run_dir: Path, stage: str) -> Path:
    return run_dir / STATE_DIR / f"{stage}.json"


def mark_started(run_dir: Path, stage: str, key: str, fields: dict, since: float | None = None) -> None:
    """Record that ``stage`` starts with ``key``; ``t0`` is when its directory began to be written (``since``: a
    resumed stage keeps its first start, so the files of the run it continues count as the stage's own)."""
    record = {"key": key, "fields": fields, "started": _now(), "t0": time.time() if since is None else since}
    atomic_write_json(started_file(run_dir, stage), record)


def write_done(
    stage_dir: Path, key: str, fields: dict, summary: dict, wall_s: float, peak_rss_mb: float | None, status: str
) -> dict:
    outputs, files = manifest(stage_dir)
    done = {
        "key": key,
        "fields": fields,
        "summary": summary,
        "wall_s": round(wall_s, 3),
        "peak_rss_mb": peak_rss_mb,
        "status": status,
        "finished": _now(),
        "t1": time.time(),
        "outputs": outputs,
        "files": files,
    }
    atomic_write_json(stage_dir / DONE_FILE, done)
    return done


# ---------------------------------------------------------------------------------------------
# what a finished stage left in its directory, and whether it is still there


def _intermediate(rel: Path) -> bool:
    return "checkpoints" in rel.parts[:-1]


def manifest(stage_dir: Path) -> tuple[dict[str, str], list[str]]:
    """(``outputs``: relative name -> SHA-256 of every file in ``stage_dir`` but ``DONE.json``, temp files and
    checkpoints; ``files``: the relative names of the files under a ``checkpoints/`` directory, not hashed)."""
    outputs, files = {}, []
    if not stage_dir.is_dir():
        return outputs, files
    for f in sorted(stage_dir.rglob("*")):
        rel = f.relative_to(stage_dir)
        if f.is_symlink() or not f.is_file() or f.name.endswith(".tmp") or str(rel) == DONE_FILE:
            continue
        if _intermediate(rel):
            files.append(rel.as_posix())
        else:
            outputs[rel.as_posix()] = digest_file(f)
    return outputs, files


def verify(stage_dir: Path, done: dict, limit: int = 3) -> list[str]:
    """What changed in a finished stage's outputs since its ``DONE.json`` (``model/model.safetensors missing``,
    ``kept.jsonl modified``); [] when every recorded output has the bytes it had. A record without ``outputs``
    (written by an older posttrain) cannot be verified and says so."""
    outputs = done.get("outputs")
    if not isinstance(outputs, dict):
        return ["its DONE.json records no digests of its outputs"]
    out = []
    for rel, digest in sorted(outputs.items()):
        f = stage_dir / rel
        if f.is_symlink() or not f.is_file():
            out.append(f"{rel} missing")
        elif digest_file(f) != digest:
            out.append(f"{rel} modified")
    if len(out) > limit:
        out = out[:limit] + [f"... {len(out) - limit} more"]
    return out


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ---------------------------------------------------------------------------------------------
# peak resident memory of one stage (Linux: the high-water mark can be reset between stages)


def reset_peak_rss() -> bool:
    """Reset this process's peak-RSS counter (Linux >= 4.0, ``clear_refs`` 5); False where not possible."""
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float | None:
    """VmHWM (peak since the last reset) in MiB, else the process's lifetime peak from getrusage."""
    try:
        for line in Path(f"/proc/{os.getpid()}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    try:
        import resource

        return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    except (ImportError, OSError):
        return None
