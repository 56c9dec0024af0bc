"""Progress off a terminal (workbench.core.progress.LineProgress, cli.common.drive): plain lines on
stderr, the first once the job has run `first_after` seconds, then at least every `every`."""

from __future__ import annotations

import io

from workbench.core.progress import LineProgress, Progress, run


def _job(clock, steps, dt):
    for i in range(steps):
        yield Progress(i, steps, f"step {i}/{steps}")
        clock[0] += dt
    return "done"


def test_line_progress_waits_then_prints_at_least_every_interval(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("workbench.core.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    assert run(_job(clock, 60, 1.0), LineProgress(out, every=10.0, first_after=10.0)) == "done"
    lines = out.getvalue().splitlines()
    # events at t = 0..59 s: nothing before 10 s, then one line every 10 s
    assert [ln.split("%")[0].strip() for ln in lines] == ["16.7", "33.3", "50.0", "66.7",
                                                          "83.3"]
    assert "step 10/60" in lines[0] and "ETA" in lines[0] and "elapsed" in lines[0]


def test_a_quick_job_prints_nothing(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("workbench.core.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    run(_job(clock, 5, 1.0), LineProgress(out, first_after=10.0))
    assert out.getvalue() == ""


def test_drive_writes_lines_when_stderr_is_not_a_terminal(monkeypatch, capsys):
    from workbench.cli.common import drive
    clock = [0.0]
    monkeypatch.setattr("workbench.core.progress.time.monotonic", lambda: clock[0])
    assert drive(_job(clock, 30, 1.0)) == "done"
    err = capsys.readouterr().err
    assert "step 10/30" in err and "\r" not in err
    # quiet (--json): no bar, the same lines; stdout untouched
    assert drive(_job(clock, 30, 1.0), quiet=True) == "done"
    out, err = capsys.readouterr()
    assert "step 10/30" in err and "\r" not in err and out == ""


def test_lines_hold_i_of_n_when_the_total_counts_steps(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr("workbench.core.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    lp = LineProgress(out, every=1.0)
    for ev in (Progress(3, 40, "gptq model.layers.3.mlp.up_proj"),   # steps: 3/40 added
               Progress(5e6, 1e7, "evaluating 3/9 model.norm"),      # its own count kept
               Progress(50, 100, "head"),                             # percent: no 50/100
               Progress(4e8, 8e8, "statistics")):                     # bytes: no count
        clock[0] += 2.0
        lp(ev)
    lines = out.getvalue().splitlines()
    assert lines[0] == "  7.5% 3/40 gptq model.layers.3.mlp.up_proj (0m00s elapsed, ETA -)"
    assert " 50.0% evaluating 3/9 model.norm (" in lines[1]
    assert " 50.0% head (" in lines[2] and "/100" not in lines[2]
    assert " 50.0% statistics (" in lines[3]


def test_the_eta_counts_from_when_the_job_starts_moving(monkeypatch):
    """A set-up of 60 s at 0 % (building the network), then 10 % every 2 s: the ETA is the
    remaining 90 % at 2 s a tenth (18 s), not 60 s of set-up extrapolated (9 min)."""
    clock = [0.0]
    monkeypatch.setattr("workbench.core.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    lp = LineProgress(out, every=1.0)
    for t, done in ((0, 0), (30, 0), (60, 0), (62, 10)):
        clock[0] = float(t)
        lp(Progress(done, 100, "step"))
    assert out.getvalue().splitlines()[-1] == " 10.0% step (1m02s elapsed, ETA 0m18s)"


def test_the_terminal_bar_shows_i_of_n_and_the_eta(monkeypatch):
    """Stdout and stderr both terminals: one line redrawn in place ('\\r'), with the same i/N
    and ETA as the lines."""
    from workbench.core.progress import TextProgress
    clock = [0.0]
    monkeypatch.setattr("workbench.core.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    bar = TextProgress(out, enabled=True)
    for t, done in ((0, 0), (10, 10), (20, 20)):
        clock[0] = float(t)
        bar(Progress(done, 40, "gptq model.layers.3"))
    bar.close()
    frames = out.getvalue().split("\r")
    assert "25.0% 10/40 gptq model.layers.3" in frames[1] and "ETA 0m30s" in frames[1]
    assert " 50.0% 20/40 " in frames[2] and "ETA 0m20s" in frames[2]
    assert frames[-1] == "" and frames[-2].strip() == ""          # cleared at the end
