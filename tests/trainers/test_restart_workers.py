"""How many SFT restarts train at once (``restart_jobs`` 0 = auto), the guard check that keeps a worker from running
a user's script again, the workers' progress, and the pipeline's and the outcomes sweep's own settings."""

import dataclasses
import sys
import types

import pytest

from posttrain.errors import ConfigError
from posttrain.pipeline import workers
from posttrain.pipeline.base import Context
from posttrain.pipeline.config import PRESETS, PipelineConfig, build_config
from posttrain.pipeline.stages import _sft_config
from posttrain.trainers import restart_workers as rw
from posttrain.trainers.distributed import World
from posttrain.trainers.sft import SFTConfig, train_sft

from .test_sft_restarts import _files, cfg

GUARDED = 'import x\n\nif __name__ == "__main__":\n    x.main()\n'


@pytest.fixture
def machine(monkeypatch):
    """A machine of ``cores`` usable cores whose program is ``script`` (None: ``python -m``, the REPL)."""

    def set_(cores=2, script=None):
        monkeypatch.setattr(workers, "usable_cores", lambda: cores)
        monkeypatch.setattr(workers, "main_rerun_by_workers", lambda: script)

    return set_


def test_auto_trains_as_many_restarts_at_once_as_the_usable_cores_hold(machine, monkeypatch):
    c = SFTConfig(restarts=4, steps=2000, threads=1)
    one = World()
    machine(cores=2)
    assert rw.auto_jobs(c, 4, 1000, one) == 2
    assert rw.auto_jobs(dataclasses.replace(c, threads=2), 4, 1000, one) == 1  # two threads each: one fills the cores
    assert rw.auto_jobs(c, 1, 1000, one) == 1  # one finalist: trained in this process
    assert rw.auto_jobs(c, 4, rw.MIN_WORKER_STEPS - 1, one) == 1  # too short to pay for a worker's start
    machine(cores=16)
    assert rw.auto_jobs(c, 4, 1000, one) == 4  # never more than the restarts of the phase
    assert rw.auto_jobs(dataclasses.replace(c, threads=4), 4, 1000, one) == 4
    assert rw.auto_jobs(dataclasses.replace(c, threads=8), 4, 1000, one) == 2
    assert rw.auto_jobs(c, 4, 1000, World(rank=0, world_size=2, local_rank=0)) == 1  # torchrun
    assert rw.auto_jobs(dataclasses.replace(c, restart_jobs=3), 4, 10, one) == 3  # an explicit value is taken
    monkeypatch.setattr(rw, "_on_cpu", lambda cfg: False)
    assert rw.auto_jobs(c, 4, 1000, one) == 1  # on a GPU the restarts would share the device


def test_by_default_every_core_trains_and_each_worker_gets_its_share_of_them(machine):
    auto, one = SFTConfig(restarts=4, steps=2000), World()  # threads None: every usable core
    assert auto.threads is None
    for cores, jobs, each in [(2, 2, 1), (3, 3, 1), (16, 4, 4), (1, 1, 1)]:
        machine(cores=cores)
        assert rw.auto_jobs(auto, 4, 1000, one) == jobs
        assert rw.worker_threads(auto, jobs) == each
    assert rw.worker_threads(dataclasses.replace(auto, threads=2), 4) == 2  # an explicit count is every worker's


def test_a_script_without_the_main_guard_trains_restarts_in_this_process(machine, tmp_path, capsys):
    bare, guarded = tmp_path / "bare.py", tmp_path / "guarded.py"
    bare.write_text("from posttrain.trainers.sft import train_sft\ntrain_sft(cfg)\n")
    guarded.write_text(GUARDED)
    c = SFTConfig(restarts=4, steps=2000, threads=1)
    machine(cores=2, script=guarded)
    assert rw.auto_jobs(c, 4, 1000, World()) == 2
    machine(cores=2, script=bare)
    assert rw.auto_jobs(c, 4, 1000, World()) == 1
    out = capsys.readouterr().out
    assert f"worker processes would run {bare} again first" in out and '`if __name__ == "__main__":`' in out
    with pytest.raises(ConfigError, match=rf'restart_jobs=2 .*run {bare} again first.*if __name__ == "__main__"'):
        rw.auto_jobs(dataclasses.replace(c, restart_jobs=2), 4, 1000, World())
    assert rw.auto_jobs(dataclasses.replace(c, restart_jobs=1), 4, 1000, World()) == 1


@pytest.mark.parametrize(
    "source, guarded",
    [
        (GUARDED, True),
        ("if '__main__' == __name__:\n    pass\n", True),
        ("if __name__ == '__main__':\n    pass\n", True),
        ("def main():\n    if __name__ == '__main__':\n        pass\n", False),  # not at the top level
        ("if __name__ != '__main__':\n    pass\n", False),
        ("main()\n", False),
        ("def broken(:\n", False),  # not Python: assume the worst
    ],
)
def test_the_main_guard_is_a_top_level_if_name_is_main(tmp_path, source, guarded):
    path = tmp_path / "script.py"
    path.write_text(source)
    assert workers.has_main_guard(path) is guarded
    assert workers.has_main_guard(tmp_path / "missing.py") is False


def test_the_file_a_worker_runs_again_is_the_script_or_the_dash_m_module(monkeypatch, tmp_path):
    def main(spec_name=None, origin=None, file=None):
        m = types.ModuleType("__main__")
        m.__spec__ = types.SimpleNamespace(name=spec_name, origin=origin) if spec_name else None
        if file:
            m.__file__ = file
        monkeypatch.setitem(sys.modules, "__main__", m)

    main(file=str(tmp_path / "train.py"))
    assert workers.main_rerun_by_workers() == tmp_path / "train.py"  # python train.py
    main(spec_name="mytool.train", origin=str(tmp_path / "mytool" / "train.py"), file="x")
    assert workers.main_rerun_by_workers() == tmp_path / "mytool" / "train.py"  # python -m mytool.train
    main(spec_name="posttrain.__main__", origin="p", file="p")
    assert workers.main_rerun_by_workers() is None  # python -m posttrain: multiprocessing skips a package's __main__
    main()
    assert workers.main_rerun_by_workers() is None  # the REPL, python -c


def test_a_workers_progress_is_the_step_of_its_last_complete_record(tmp_path):
    assert rw.last_step(tmp_path) == 0  # no metrics yet
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')
    assert rw.last_step(tmp_path) == 2  # the line being written is skipped
    (tmp_path / "metrics.jsonl").write_text("".join(f'{{"step": {i}, "pad": "{"x" * 100}"}}\n' for i in range(1, 500)))
    assert rw.last_step(tmp_path) == 499


def test_auto_runs_the_restarts_in_workers_bit_for_bit_as_one_at_a_time_with_one_progress_bar(
    machine, monkeypatch, tmp_path, capsys
):
    """restart_jobs 0 on 2 usable cores: the probes train two at a time in workers (their progress shown here as
    one count of steps), the two finalists too, and every weight file equals the one-at-a-time run's."""
    machine(cores=2)
    monkeypatch.setattr(rw, "MIN_WORKER_STEPS", 1)  # the test's runs are 6 steps
    kw = dict(restarts=4, restart_probe=0.5, restart_keep=2, keep_checkpoints=4, threads=1)
    train_sft(cfg(tmp_path / "one", restart_jobs=1, **kw))
    capsys.readouterr()
    train_sft(cfg(tmp_path / "auto", restart_jobs=0, progress=True, **kw))
    out, err = capsys.readouterr()
    assert out.count("SFT restarts, 2 at a time in worker processes") == 2  # the probes, then the finalists
    assert "SFT restarts: 12/12" in err and "SFT restarts: 6/6" in err  # 4 probes x 3 steps; 2 finalists x 3
    a, b = _files(tmp_path / "one"), _files(tmp_path / "auto")
    assert sorted(a) == sorted(b) and [k for k in a if a[k] != b[k] and k.endswith(".safetensors")] == []
    assert (tmp_path / "auto" / "restarts" / "0.log").read_text()


def test_the_pipelines_sft_stages_run_their_restarts_one_at_a_time_beside_other_stages(tmp_path):
    tiny = build_config(PipelineConfig, PRESETS["tiny"])
    assert tiny.sft.restart_jobs == 0  # the trainer's default: auto
    for jobs, want in ((2, 1), (1, 0)):  # --jobs 2: sft and sft_raw share the cores already
        ctx = Context(cfg=dataclasses.replace(tiny, jobs=jobs), run_dir=tmp_path)
        assert _sft_config("train.jsonl", "sft")(ctx).restart_jobs == want
