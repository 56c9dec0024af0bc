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
    assert drive(_job(clock, 30, 1.0), quiet=True) == "done"
    assert capsys.readouterr().err == ""
