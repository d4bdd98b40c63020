"""posttrain.progress: a tqdm bar on a terminal, a handful of plain lines anywhere else."""

import io

import pytest

from posttrain import progress as P


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class TTY(io.StringIO):
    def isatty(self):
        return True


def test_known_total_prints_one_line_per_ten_percent_with_postfix():
    out = io.StringIO()
    bar = P.progress(range(1000), total=1000, desc="sft", file=out, dynamic_ncols=True, mininterval=1.0)
    for i in bar:
        bar.set_postfix(loss=f"{i / 1000:.3f}", acc="0.500")
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert len(lines) == 10, lines
    assert [ln.split(" ")[1] for ln in lines] == [f"{k}00/1000" for k in range(1, 11)]
    assert lines[0].startswith("sft: 100/1000 (10%), ") and lines[0].endswith("loss=0.099, acc=0.500")
    assert lines[-1].endswith("loss=0.999, acc=0.500")


def test_resume_counts_from_initial_and_close_reports_an_early_stop():
    out = io.StringIO()
    bar = P.progress(range(400, 1000), initial=400, total=1000, desc="dpo", file=out)
    for step in bar:
        if step + 1 == 750:
            break  # an early stop inside step 749: close() reports the 749 finished (as tqdm counts)
    bar.close()
    counts = [ln.split(" ")[1] for ln in out.getvalue().splitlines()]
    assert counts == ["500/1000", "600/1000", "700/1000", "749/1000"]


@pytest.mark.parametrize("every", [25.0, 2.0])
def test_every_pct(every):
    out = io.StringIO()
    with P.progress(total=200, file=out, every_pct=every) as bar:
        for _ in range(200):
            bar.update()
    assert len(out.getvalue().splitlines()) == int(100 / every)


def test_unknown_total_prints_every_interval_seconds_and_at_close():
    out, clock = io.StringIO(), FakeClock()
    bar = P.LineProgress(desc="dedup: sketch", unit="doc", file=out, interval=10.0, clock=clock)
    for _ in range(95):  # 95 batches of 100 documents, one second each
        clock.t += 1.0
        bar.update(100)
    bar.close()
    lines = out.getvalue().splitlines()
    assert [ln.split(",")[0] for ln in lines] == [
        f"dedup: sketch: {n} doc" for n in (1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 9500)
    ]
    assert lines[0] == "dedup: sketch: 1000 doc, 00:10, 100 doc/s"


def test_unknown_total_default_interval_and_no_line_before_it():
    out, clock = io.StringIO(), FakeClock()
    bar = P.LineProgress(file=out, clock=clock)
    for _ in range(1000):
        bar.update()  # no time passes: nothing until close
    assert out.getvalue() == ""
    clock.t = P.DEFAULT_INTERVAL_S
    bar.update()
    assert out.getvalue().startswith("1001 it, 00:10")
    bar.close()
    assert len(out.getvalue().splitlines()) == 1  # nothing moved since: close adds no line


def test_disabled_is_silent_but_iterates():
    out = io.StringIO()
    bar = P.progress(range(50), total=50, file=out, disable=True)
    assert list(bar) == list(range(50))
    bar.set_postfix(loss=1)
    bar.write("hidden")
    bar.close()
    assert out.getvalue() == ""


def test_disable_none_means_lines_not_silence():
    out = io.StringIO()
    list(P.progress(range(10), desc="reading", file=out, disable=None))
    assert len(out.getvalue().splitlines()) == 10  # 10 items: every item is another 10 %


def test_tty_gets_a_real_tqdm_bar():
    from tqdm.auto import tqdm

    out = TTY()
    bar = P.progress(range(5), total=5, desc="sft", file=out, mininterval=0)
    assert isinstance(bar, tqdm)
    for _ in bar:
        bar.set_postfix(loss="1.000")
    assert "\r" in out.getvalue() and "loss=1.000" in out.getvalue()


def test_stderr_is_the_default_stream(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    list(P.progress(range(10), total=10, desc="x"))
    assert len(err.getvalue().splitlines()) == 10


def test_module_level_write_is_tqdm_write(capsys):
    P.tqdm.write("ALARM step 3: x")
    assert capsys.readouterr().out == "ALARM step 3: x\n"
