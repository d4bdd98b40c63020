"""The ``posttrain`` command line: one subcommand per module in this package, and one per trainer of the registry
(``trainers/engine/registry.py``; generated in ``_trainers.py``: ``sft``, ``rm``, ``dpo``, ``grpo``, ``ppo``).

Each module ``posttrain/cli/<name>.py`` (no leading underscore) defines

    NAME = "sft"                     # the subcommand (defaults to the module name)
    HELP = "one line for --help"
    def add_arguments(parser): ...   # flags; usually config.add_config_flags(parser, SomeConfig)
    def run(args) -> int: ...        # parse flags into the dataclass config, call the Python API

Modules keep heavy imports (torch, trainers) inside ``add_arguments`` and ``run``, and ``build_parser``
calls ``add_arguments`` only for the subcommand the command line names, so ``posttrain --help`` imports
no trainer and no torch (``posttrain sft --help`` imports what the SFT flags need).

Error boundary (``main``), never a traceback for these:

- :class:`posttrain.errors.UserError`: one line ``posttrain CMD: error: <message>``, exit status 2.
- ``OSError`` (read-only or full disk, permission denied, ``--out`` that is a file, a path under a file...):
  one line ``posttrain CMD: error: <path>: <strerror>`` (with a hint for EEXIST/ENOTDIR naming the file in
  the way; an atomic write's temp file is named as its target), exit status 2 as well: the house code for "fix something and run again", and a full disk is
  fixed the same way.  Standard output is flushed inside the boundary, so ``> /dev/full`` (ENOSPC on the
  last flush) is ``error: writing standard output: No space left on device``, not an error at shutdown.
- ``BrokenPipeError`` on standard output (``posttrain tokenizer encode ... | head -1``): no message, exit
  status 141 = 128 + SIGPIPE, what the shell shows for ``cat``/``grep`` killed by the same closed pipe, so
  ``set -o pipefail`` scripts see the usual code.  Standard output is pointed at /dev/null first so the
  interpreter's final flush cannot fail again.  A broken pipe elsewhere (a child process) is an OSError.
- A full disk that safetensors (``SafetensorError ... (os error 28)``) or ``torch.save`` (``unexpected pos``,
  the disk is then checked with statvfs) report as their own exception types: as the OSError above.
- ``KeyboardInterrupt``: ``posttrain CMD: interrupted``, exit status 130.

Other exceptions are bugs and keep their traceback; ``POSTTRAIN_TRACEBACK=1`` keeps it for I/O errors too.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import pkgutil
import re
import sys

from posttrain import __version__
from posttrain.errors import UserError


def _command_modules():
    """The subcommands, by name: each module of this package, and one per trainer of the registry (``_trainers``)."""
    from posttrain.cli._trainers import COMMANDS as TRAINER_COMMANDS

    pkg = sys.modules[__name__]
    mods = list(TRAINER_COMMANDS)
    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name.startswith("_"):
            continue
        mods.append(importlib.import_module(f"{__name__}.{info.name}"))
    return sorted(mods, key=lambda m: getattr(m, "NAME", m.__name__.rsplit(".", 1)[-1]))


def named_command(argv: list[str]) -> str | None:
    """The subcommand ``argv`` names: its first word that is not an option (the top level has only
    ``--help`` and ``--version``, which take no value). ["sft", "--steps", "3"] -> "sft"; ["--help"] -> None."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The full parser; with ``argv``, only the subcommand it names gets its flags (the others are listed
    with their one-line help), so building it imports only that subcommand's configs."""
    chosen = named_command(argv) if argv is not None else None
    parser = argparse.ArgumentParser(
        prog="posttrain",
        description="LLM post-training from raw text to an aligned model: dedup, tokenizers, SFT, RM, RL, DPO.",
    )
    parser.add_argument("--version", action="version", version=f"posttrain {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for mod in _command_modules():
        name = getattr(mod, "NAME", mod.__name__.rsplit(".", 1)[-1])
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        if argv is None or name == chosen:
            mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _cmd=name)
    return parser


EXIT_USER = 2  # UserError and OSError: fix something, run again
EXIT_SIGPIPE = 128 + 13  # the reader of standard output went away (as a process killed by SIGPIPE)


def main(argv: list[str] | None = None) -> int:
    prog = ["posttrain"]  # "posttrain CMD" once the command is parsed
    if os.environ.get("RANK", "0") != "0":  # under torchrun: rank 0 prints, the others only report errors (stderr)
        sys.stdout = open(os.devnull, "w")
    try:
        return _main(argv, prog)
    except UserError as e:
        return _fail(prog[0], str(e))
    except KeyboardInterrupt:
        _settle_stdout()
        _say(f"{prog[0]}: interrupted")
        return 130
    except BrokenPipeError as e:
        if _stdout_broken():
            _silence_stdout()
            return EXIT_SIGPIPE
        return _os_fail(prog[0], e)
    except OSError as e:
        return _os_fail(prog[0], e)
    except Exception as e:  # safetensors and torch.save report a full disk as their own types
        io_error = as_os_error(e)
        if io_error is None:
            raise
        return _os_fail(prog[0], io_error, e)


def _os_fail(prog: str, e: OSError, raised: BaseException | None = None) -> int:
    if os.environ.get("POSTTRAIN_TRACEBACK"):  # debugging: the full traceback instead of the one line
        raise raised or e
    return _fail(prog, describe_os_error(e))


def _main(argv, prog: list[str]) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    try:
        args = parser.parse_args(argv)
    except SystemExit:  # --help, --version, a bad flag: their output must reach the stream now
        sys.stdout.flush()
        raise
    if not hasattr(args, "_run"):
        parser.print_help()
        sys.stdout.flush()
        return 2
    prog[0] = f"posttrain {args._cmd}"
    rc = int(args._run(args) or 0)
    _leave_process_group()
    sys.stdout.flush()  # inside the boundary: a full disk or closed pipe on the last write is reported here
    return rc


def _leave_process_group() -> None:
    """Under torchrun: every rank leaves the process group together (trainers/distributed.py)."""
    if "torch.distributed" in sys.modules:  # never imported here for a one-process command
        from posttrain.trainers.distributed import leave_process_group

        leave_process_group()


_TMP_PART = re.compile(r"^\.(.+)\.[A-Za-z0-9_]+\.tmp$")  # posttrain.data.io.atomic_open/atomic_dir temp names


def as_os_error(e: BaseException) -> OSError | None:
    """The OSError behind an I/O failure that safetensors or torch.save raise as another type, else None."""
    if isinstance(e, OSError):
        return e
    msg = str(e)
    m = re.search(r"\(os error (\d+)\)", msg)
    if type(e).__name__ == "SafetensorError" and m:
        n = int(m.group(1))
        return OSError(n, os.strerror(n), _path_in_traceback(e))
    if isinstance(e, RuntimeError) and ("PytorchStreamWriter" in msg or "unexpected pos" in msg):
        path = _path_in_traceback(e)  # torch.save's message says nothing of the cause: look at the disk
        try:
            full = path is not None and os.statvfs(os.path.dirname(os.path.abspath(path))).f_bavail == 0
        except OSError:
            full = False
        if full:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return OSError(errno.EIO, f"write failed ({msg.strip().splitlines()[-1][:200]})", path)
    return None


def _path_in_traceback(e: BaseException) -> str | None:
    tb, frames = e.__traceback__, []
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames[-4:]):
        for name in ("filename", "f", "path", "file"):
            v = frame.f_locals.get(name)
            if isinstance(v, (str, os.PathLike)):
                return os.fspath(v)
    return None


def _display_path(path: str) -> str:
    """An atomic write's temp name shown as the file it was going to become."""
    parts = path.split(os.sep)
    return os.sep.join(m.group(1) if (m := _TMP_PART.match(part)) else part for part in parts)


def describe_os_error(e: OSError) -> str:
    """``<path>: <strerror>`` for an OSError, with the obstacle named for EEXIST/ENOTDIR."""
    what = e.strerror or str(e) or type(e).__name__
    if e.filename is None:  # a write to an open stream: name the stream if it can be found
        stream = _stream_in_traceback(e)
        if stream is None and _stdout_fails():
            stream = "standard output"
        return f"writing {_display_path(stream)}: {what}" if stream else what
    path = os.fsdecode(e.filename) if isinstance(e.filename, (str, bytes, os.PathLike)) else str(e.filename)
    if e.filename2 is not None:
        path = f"{_display_path(path)} -> {_display_path(os.fsdecode(e.filename2))}"
    elif e.errno == errno.EEXIST and os.path.lexists(path) and not os.path.isdir(path):
        what += " and is not a directory"
    elif e.errno == errno.ENOTDIR:
        block = _first_non_directory(path)
        if block is not None and block != path:
            what += f" ({block} is a file)"
    return f"{_display_path(path)}: {what}"


def _stream_in_traceback(e: BaseException) -> str | None:
    """The name of the open file the innermost frames were writing (``f.write`` raises without a path)."""
    import io

    frames, tb = [], e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    std = {id(s): "standard output" for s in (sys.stdout, sys.__stdout__, getattr(sys.stdout, "buffer", None))}
    std.update({id(s): "standard error" for s in (sys.stderr, sys.__stderr__)})
    for frame in reversed(frames[-3:]):
        values = list(frame.f_locals.values())
        owner = frame.f_locals.get("self")
        values += list(getattr(owner, "__dict__", {}).values())  # self._fh.write(...) in a logger
        for v in values:
            if isinstance(v, io.IOBase):  # closed or not: a `with` block has closed it by now
                if id(v) in std:
                    return std[id(v)]
                if isinstance(getattr(v, "name", None), str):
                    return v.name
    return None


def _first_non_directory(path: str) -> str | None:
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        p = os.sep.join(parts[:i])
        if os.path.lexists(p) and not os.path.isdir(p):
            return p if os.path.isabs(path) else os.path.relpath(p)
    return None


def _fail(prog: str, message: str) -> int:
    from posttrain.text import printable  # a message may quote file names or data: print it escaped

    _settle_stdout()
    _say(f"{prog}: error: {printable(message)}")
    return EXIT_USER


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr itself is closed or full: nothing more to do
        pass


def _stdout_fails() -> bool:
    """Whether standard output cannot take more: the flush fails, or a zero-byte write does (/dev/full)."""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        return True
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no file descriptor (captured in tests): the flush passed
        return False
    try:
        os.write(fd, b"")
    except OSError:
        return True
    return False


def _settle_stdout() -> None:
    """Make the interpreter's final flush of stdout harmless: what cannot be written now is dropped."""
    if _stdout_fails():
        _silence_stdout()


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


def _stdout_broken() -> bool:
    """Whether standard output's reader is gone (poll reports an error on the pipe's write end)."""
    try:
        import select

        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))
    except (OSError, ValueError, AttributeError, ImportError):  # no poll or no real stdout: assume it was
        return True


if __name__ == "__main__":
    raise SystemExit(main())
