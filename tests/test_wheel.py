"""The package as a user gets it: ``python -m build`` makes an sdist and, from it, a wheel; the wheel installed in a
clean virtual environment gives ``posttrain --version`` (pyproject.toml's version, the one place it is written) and
trains a few SFT steps.

No download: the build runs without isolation on this environment's setuptools, the wheel is installed with
``--no-deps --no-index``, and its dependencies (torch, numpy, ...) are this environment's, reached through a ``.pth``
line in the clean environment's site-packages. The test checks that ``posttrain`` is imported from the wheel's copy,
not from this source tree, and that the installed metadata's requirements are all met (``pip check``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.mark.slow
def test_the_wheel_installs_and_runs_in_a_clean_environment(tmp_path):
    pytest.importorskip("build")
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)], cwd=tmp_path)
    wheels = sorted(dist.glob(f"posttrain-{version}-*.whl"))
    assert len(wheels) == 1 and (dist / f"posttrain-{version}.tar.gz").is_file(), sorted(os.listdir(dist))

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt").create(env_dir)  # no pip, no old setuptools
    bindir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # this environment's packages (torch, numpy, ...), but not its posttrain: a plain path line, so the editable
    # install's own .pth there is not processed
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(py)]  # this pip, run by the clean interpreter
    _run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheels[0])])

    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    where = _run([str(py), "-c", "import posttrain; print(posttrain.__file__)"], cwd=tmp_path, env=clean).stdout
    assert Path(where.strip()).is_relative_to(site), where
    _run([*pip, "check"], cwd=tmp_path, env=clean)

    out = _run([str(bindir / "posttrain"), "--version"], cwd=tmp_path, env=clean).stdout
    assert out.strip() == f"posttrain {version}"

    run = tmp_path / "sft"
    cmd = [str(bindir / "posttrain"), "sft", "--steps", "3", "--out", str(run), "--progress", "false"]
    _run(cmd, cwd=tmp_path, env=clean)
    assert (run / "summary.json").is_file() and (run / "model" / "model.safetensors").is_file()
