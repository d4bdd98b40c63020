"""Dedup pass 1 in parallel: the worker that sketches a batch of raw lines, and the backends that map it.

``process_batch`` parses, normalises, shingles and sketches one batch; only the compact per-document
result comes back (a (K,) uint32 MinHash signature, a uint64 SimHash or a 16-byte digest), plus the
ids and any contamination hits. A backend (:data:`BACKENDS`: local processes or Ray tasks) maps it over
the batches with a bounded number in flight and yields the results in input order, so every backend
and worker count gives the same arrays.

Not handled: backends other than local processes and Ray.
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from posttrain.data.dedup import contamination as C
from posttrain.data.dedup.exact import content_hashes
from posttrain.data.dedup.minhash import MINHASH_SCHEMES
from posttrain.data.dedup.records import parse_line, record_text
from posttrain.data.dedup.shingles import SHINGLERS, normalize
from posttrain.data.dedup.simhash import simhash

# ---------------------------------------------------------------------------------------------
# pass 1 worker: raw batch -> compact per-document results


_STATE: dict[str, Any] = {}


def _init_worker(cfg, eval_index) -> None:
    _STATE["cfg"], _STATE["eval"] = cfg, eval_index


def process_batch(batch: list[tuple[int, Any]], cfg=None, eval_index=None) -> dict:
    """Parse, normalise and sketch one batch. Returns good line numbers, ids, bad lines and arrays."""
    cfg = cfg if cfg is not None else _STATE["cfg"]
    eval_index = eval_index if eval_index is not None else _STATE.get("eval")
    lines, ids, texts, bad = [], [], [], []
    for line_no, raw in batch:
        if isinstance(raw, (bytes, bytearray)):
            rec, reason = parse_line(raw)
        else:
            rec, reason = raw, None
        if rec is not None:
            try:
                text = record_text(rec, cfg.key, cfg.text_field)
                if cfg.id_field is not None:
                    if cfg.id_field not in rec:
                        raise ValueError(f"missing field {cfg.id_field!r}")
                    ids.append(rec[cfg.id_field])
                texts.append(normalize(text, cfg.norm_steps))
                lines.append(line_no)
            except ValueError as e:
                reason = str(e)
        if reason is not None:
            bad.append(
                (line_no, reason, raw if isinstance(raw, (bytes, bytearray)) else json.dumps(raw, default=str).encode())
            )
    out: dict[str, Any] = {"lines": np.array(lines, np.int64), "ids": ids, "bad": bad}
    out["empty"] = np.array([len(t) == 0 for t in texts], bool)
    if cfg.method == "minhash":
        h, off = SHINGLERS[cfg.shingle](texts, cfg.ngram)
        out["sig"] = MINHASH_SCHEMES[cfg.scheme](h, off, cfg.num_perm, cfg.seed)
    elif cfg.method == "simhash":
        h, off = SHINGLERS[cfg.shingle](texts, cfg.ngram)
        out["sig"] = simhash(h, off, seed=cfg.seed)
    else:
        out["sig"] = content_hashes(texts)
    if eval_index is not None:
        out["contam"] = C.check_batch(eval_index, texts)
    return out


# ---------------------------------------------------------------------------------------------
# backends: map process_batch over an iterator of batches, results in input order, bounded in flight


def resolve_workers(n: int) -> int:
    return n if n > 0 else (os.cpu_count() or 1)


def _local_map(batches: Iterator, cfg, eval_index) -> Iterator[dict]:
    workers = resolve_workers(cfg.workers)
    if workers == 1:
        for b in batches:
            yield process_batch(b, cfg, eval_index)
        return
    import multiprocessing as mp

    ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
    with ctx.Pool(workers, initializer=_init_worker, initargs=(cfg, eval_index)) as pool:
        pending: collections.deque = collections.deque()
        for b in batches:
            pending.append(pool.apply_async(process_batch, (b,)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _ray_map(batches: Iterator, cfg, eval_index) -> Iterator[dict]:
    import ray

    if not ray.is_initialized():
        address = cfg.ray_address or os.environ.get("RAY_ADDRESS")
        if address:  # an existing cluster: ship this package to its workers
            import posttrain

            ray.init(
                address=address, log_to_driver=False, runtime_env={"py_modules": [str(Path(posttrain.__file__).parent)]}
            )
        else:
            ray.init(num_cpus=resolve_workers(cfg.workers), include_dashboard=False, log_to_driver=False)
    remote = ray.remote(process_batch)
    cfg_ref, eval_ref = ray.put(cfg), ray.put(eval_index)
    in_flight = 2 * max(1, int(ray.available_resources().get("CPU", 1)))
    pending: collections.deque = collections.deque()
    for b in batches:
        pending.append(remote.remote(b, cfg_ref, eval_ref))
        if len(pending) >= in_flight:
            yield ray.get(pending.popleft())
    while pending:
        yield ray.get(pending.popleft())


BACKENDS: dict[str, Callable[..., Iterator[dict]]] = {"local": _local_map, "ray": _ray_map}
