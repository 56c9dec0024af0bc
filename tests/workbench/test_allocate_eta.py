"""allocate's time as the user reads it (issue 49): "expected: about 35 s" took 197 s on a
loaded machine, and progress lines showed ETAs such as "12m47s" in a 74 s run. The expected
line says it is for a quiet machine and corrects itself by the load as the work starts; a
progress line's ETA is not extrapolated across a fraction that went back; the fisher pass
(the measure allocate runs by default) reports one fraction that never goes back."""

from __future__ import annotations

import io
import re

from workbench.core.progress import LineProgress, Progress, run
from workbench.planning.allocate_cost import Cost, busy_factor, busy_line, lines


def test_the_expected_line_is_for_a_quiet_machine_and_corrected_by_the_load():
    cost = Cost({"building the network": 6.0, "fisher pass over 16 samples": 29.0})
    (line,) = lines(cost, [])
    assert line.startswith("expected: about 35 s on 2 quiet cores")
    assert line.endswith("a busy machine takes longer")
    assert busy_line(cost, (0.2, 2)) is None           # quiet: nothing more to say
    # the run that took 197 s: load 9 on 2 cores, (9 + 2) / 2 = 5.5 x 35 s = 3 min 12 s
    busy = busy_line(cost, (9.0, 2))
    assert busy == ("  0.0% this machine is busy now (load 9.0 on 2 cores): about 3 min 12 s, "
                    "not 35 s (0m00s elapsed, ETA 3m12s)")
    # said as a progress line: the README tour leaves those out, so it reads the same at any
    # load
    from workbench.bench.tour import _PROGRESS
    assert _PROGRESS.match(f"allocate: {busy}".strip())
    assert busy_factor((9.0, 2)) == 5.5
    assert busy_factor((7.6, 16)) == 1.0          # many cores: the load does not slow it
    assert busy_factor(None) == 1.0


def test_allocate_says_the_corrected_time_on_a_busy_machine(demo_model_path, tmp_path, capsys,
                                                            monkeypatch):
    import workbench.planning.allocate_cost as cost
    from workbench.cli import main
    monkeypatch.setattr(cost, "machine_load", lambda: (9.0, 2))
    assert main(["allocate", str(demo_model_path), "--budget-bpw", "5", "--measure", "weight",
                 "--schemes", "q4_k,q8_0", "-o", str(tmp_path / "plan.json")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("allocate: expected: about ")
    assert err[1].startswith("allocate:   0.0% this machine is busy now (load 9.0 on 2 cores)")


def _eta_seconds(line: str) -> float | None:
    m = re.search(r"ETA (\d+)m(\d+)s", line)
    return None if m is None else 60 * int(m.group(1)) + int(m.group(2))


def test_an_eta_is_not_extrapolated_across_a_fraction_that_went_back(monkeypatch):
    """A job whose stages each count from 0 (a forward pass, then the backward): the
    fraction falls from 32 % to 9 %. The ETA after the fall is measured from the fall, so it
    is the rate of what runs now, not 2m44s spread over the 9 %."""
    clock = [0.0]
    monkeypatch.setattr("workbench.core.progress.time.monotonic", lambda: clock[0])

    def job():
        for i in range(33):             # 0..32 % in 99 s
            yield Progress(i, 100, "forward")
            clock[0] += 3.0
        for i in range(9, 60):          # back to 9 %, then 1 % a second
            yield Progress(i, 100, "backward")
            clock[0] += 1.0
        return "done"
    out = io.StringIO()
    assert run(job(), LineProgress(out, every=5.0)) == "done"
    after = [ln for ln in out.getvalue().splitlines() if "backward" in ln]
    etas = [e for e in map(_eta_seconds, after) if e is not None]
    assert etas
    # at 1 %/s from the fall, what is left of the 100 % takes at most 91 s
    assert max(etas) <= 91


def test_the_fisher_pass_fraction_never_goes_back(demo_model_path):
    from workbench.formats.loaders import open_model
    from workbench.planning.fisher import fisher_diagonals
    seen = []
    run(fisher_diagonals(open_model(str(demo_model_path)), samples=4),
        lambda ev: seen.append(ev.fraction))
    assert len(seen) > 5 and seen[-1] == 1.0
    assert all(b >= a - 1e-12 for a, b in zip(seen, seen[1:])), seen
