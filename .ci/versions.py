"""One line naming what the tests run on: Python, torch, triton, numpy, bubblewrap, CPU model, threads."""

import os
import platform
import shutil
import subprocess


def _version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: say so instead of failing CI here
        return "absent"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _bwrap() -> str:
    path = shutil.which("bwrap")
    if path is None:
        return "absent (sandbox isolation tests skip)"
    out = subprocess.run([path, "--version"], capture_output=True, text=True).stdout.split()
    version = out[-1] if out else "present"
    try:  # bwrap may be installed but unusable (user namespaces blocked): the sandbox's own self-test says
        from posttrain.rewards.isolation import bwrap_problem

        problem = bwrap_problem()
    except Exception as e:  # an import failure is the tests' business; here, just report it
        problem = f"self-test not run: {e}"
    return version if problem is None else f"{version}, unusable: {problem}"


print(
    f"python {platform.python_version()} | torch {_version('torch')} | triton {_version('triton')} | "
    f"numpy {_version('numpy')} | bwrap {_bwrap()} | cpu {_cpu_model()} ({os.cpu_count()} cores)",
    flush=True,
)
