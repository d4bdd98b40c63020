"""Per-run cgroups for the sandbox: a process count (``pids``) and a memory cap (``memory``) over everything it starts.

Key insight: rlimits are per process (RLIMIT_AS) or per user (RLIMIT_NPROC), so 64 children of 256 MB each
are within every rlimit and still take 16 GB; a cgroup counts the whole tree. One is made per run where
``/sys/fs/cgroup`` lets us (cgroup v1: the ``pids`` and ``memory`` hierarchies; v2: the root with the
controller in ``cgroup.subtree_control``), the sandbox is placed in it before it can fork, and it is removed
after the run:

    pids.max = max_processes
    v2: memory.max = memory_bytes, memory.swap.max = 0, memory.oom.group = 1   (the whole run dies together)
    v1: memory.limit_in_bytes = memory.memsw.limit_in_bytes = memory_bytes   (no swapping past the cap)

Where a controller is not available (no write access, a container without delegation) the run goes on
without it: then the process count is bounded by RLIMIT_NPROC and memory by RLIMIT_AS per process only.
"""

from __future__ import annotations

import functools
import os
import time
import uuid

PREFIX = "posttrain-sandbox-"
_V2 = "/sys/fs/cgroup"


def _write(path: str, value: str, *, optional: bool = False) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError:
        if not optional:
            raise


def make_cgroup(root: str, *, max_pids: int | None = None, memory_bytes: int | None = None) -> str:
    """Create a per-run cgroup under ``root`` with the given limits; its path (raises OSError, leaving nothing)."""
    path = os.path.join(root, f"{PREFIX}{uuid.uuid4().hex[:12]}")
    os.mkdir(path)
    try:
        if max_pids is not None:
            _write(os.path.join(path, "pids.max"), str(int(max_pids)))
        if memory_bytes is not None:
            if os.path.exists(os.path.join(path, "memory.max")):  # v2
                _write(os.path.join(path, "memory.max"), str(int(memory_bytes)))
                _write(os.path.join(path, "memory.swap.max"), "0", optional=True)
                _write(os.path.join(path, "memory.oom.group"), "1", optional=True)
            else:  # v1: the memsw limit (memory + swap) only exists with swap accounting
                _write(os.path.join(path, "memory.limit_in_bytes"), str(int(memory_bytes)))
                _write(os.path.join(path, "memory.memsw.limit_in_bytes"), str(int(memory_bytes)), optional=True)
    except OSError:
        os.rmdir(path)
        raise
    return path


def make_pids_cgroup(root: str, max_pids: int) -> str:
    return make_cgroup(root, max_pids=max_pids)


def _find_root(controller: str) -> str | None:
    for root, v2 in ((os.path.join(_V2, controller), False), (_V2, True)):
        try:
            if v2 and controller not in open(os.path.join(root, "cgroup.subtree_control")).read().split():
                continue
            limits = {"max_pids": 8} if controller == "pids" else {"memory_bytes": 64 << 20}
            remove_cgroup(make_cgroup(root, **limits))
        except OSError:
            continue
        _sweep(root)
        return root
    return None


@functools.lru_cache(maxsize=None)
def pids_cgroup_root() -> str | None:
    """A cgroup directory under which we may create per-run pids cgroups, or None (checked once per process)."""
    return _find_root("pids")


@functools.lru_cache(maxsize=None)
def memory_cgroup_root() -> str | None:
    """A cgroup directory under which we may create per-run memory cgroups, or None (checked once per process)."""
    return _find_root("memory")


def make_run_cgroups(max_pids: int, memory_bytes: int | None) -> list[str]:
    """The cgroups one run joins: one per hierarchy (v1 has one per controller, v2 one for both); may be empty."""
    wanted: dict[str, dict] = {}
    if (root := pids_cgroup_root()) is not None:
        wanted.setdefault(root, {})["max_pids"] = max_pids
    if memory_bytes is not None and (root := memory_cgroup_root()) is not None:
        wanted.setdefault(root, {})["memory_bytes"] = memory_bytes
    made: list[str] = []
    for root, limits in wanted.items():
        try:
            made.append(make_cgroup(root, **limits))
        except OSError:
            pass  # that controller is simply not used for this run
    return made


def oom_kills(path: str) -> int:
    """How many processes the kernel's OOM killer took in the memory cgroup ``path`` (0 when unknown)."""
    for name in ("memory.events", "memory.oom_control"):  # v2, v1
        try:
            with open(os.path.join(path, name)) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        except (OSError, ValueError):
            continue
    return 0


def _sweep(root: str, min_age_s: float = 600.0) -> None:
    """Remove per-run cgroups that earlier runs left (their last task outlived remove_cgroup's retries): only
    old ones, so a run of another process that has just made its cgroup is left alone."""
    for name in os.listdir(root):
        path = os.path.join(root, name)
        try:
            if name.startswith(PREFIX) and time.time() - os.stat(path).st_mtime > min_age_s:
                os.rmdir(path)  # fails (EBUSY) while it still has tasks
        except OSError:
            pass


def remove_cgroup(path: str, tries: int = 50) -> None:
    """rmdir the cgroup once its (dying) tasks are gone; gives up quietly (a later process sweeps leftovers)."""
    for _ in range(tries):
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.01)


def join(path: str, pid: int) -> None:
    """Move process ``pid`` into the cgroup ``path`` (raises OSError)."""
    _write(os.path.join(path, "cgroup.procs"), str(int(pid)))


def join_cgroup_argv(cgroups: list[str] | str, argv: list[str]) -> list[str]:
    """Run ``argv`` inside ``cgroups``: a shell joins them, then execs argv, so every descendant is in them."""
    paths = [cgroups] if isinstance(cgroups, str) else list(cgroups)
    script = (
        'for g in "$@"; do [ "$g" = -- ] && break; echo $$ > "$g/cgroup.procs" || exit 125; shift; done; '
        'shift; exec "$@"'
    )
    return ["/bin/sh", "-c", script, "sh", *paths, "--", *argv]
