"""README.md's tour shows today's outputs: every command of the tour runs, in order, in an empty
folder (workbench/bench/tour.py, the same runner as `quant-workbench bench-docs --readme`), and
each output block must equal what its command printed, under the block's `<!-- tour: -->` spec,
wall times normalised. A drift fails here; `quant-workbench bench-docs --readme` rewrites it."""

from __future__ import annotations

import pytest

from workbench.bench import tour


def test_spec_selects_lines_and_marks_elisions():
    out = [f"l{i}" for i in range(1, 8)]
    assert tour.select(out, "1-2, …, last 2") == ["l1", "l2", "…", "l6", "l7"]
    assert tour.select(out, "6-") == ["l6", "l7"]
    assert tour.select(out, "3") == ["l3"]
    assert tour.select(out, "none") == [] and tour.select(out, "all") == out
    for bad in ("9", "last 8", "3-2", "first 2"):
        with pytest.raises(tour.TourError):
            tour.select(out, bad)


def test_wall_times_are_normalised_and_figures_are_not():
    a = "fisher ... predicted 0.00532 (optimal); solved in 11.1 ms; 218 pairs in 45.6 s, 12m47s"
    b = "fisher ... predicted 0.00532 (optimal); solved in 2.4 ms; 218 pairs in 101 s, 0m05s"
    assert tour.normalise(a) == tour.normalise(b)
    assert tour.normalise("14,190,136 bytes, 4.999 bits/weight, 64 samples, 20.98 dB") == \
        "14,190,136 bytes, 4.999 bits/weight, 64 samples, 20.98 dB"


def test_the_readme_parses_and_keeps_its_top():
    text = tour.README.read_text(encoding="utf-8")
    lines, blocks = tour.parse(text)
    assert len(lines) <= 301, "README.md is over 300 lines"        # (the last "\n" splits)
    assert "bash .ci/setup && quant-workbench  " in text
    assert "bash .ci/setup && QT_QPA_PLATFORM=offscreen python3 -m pytest -q  " in text
    commands = [c.line for b in blocks for c in b.commands]
    assert sum(c.startswith("quant-workbench ") for c in commands) >= 12
    assert any(b.shell and any(s.startswith("MINILM=") for s in b.lines) for b in blocks)


def test_render_then_check_round_trips():
    readme = "\n".join([
        "# x", "## A tour", "```sh", "X=1", "```", "<!-- tour: 1, …, last 1; none -->", "```",
        "$ quant-workbench a    # a remark", "old", "$ quant-workbench b", "old b", "```",
        "```", "$ quant-workbench c", "```", "## After", ""])
    lines, blocks = tour.parse(readme)
    assert [c.spec for c in blocks[1].commands] == ["1, …, last 1", "none"]
    run = tour.Run([[], [["a1", "a2", "solved in 2.0 ms"], ["b1"]], [["c1", "c2"]]], {})
    text = tour.render(lines, blocks, run)
    assert text.split("\n")[6:15] == [
        "```", "$ quant-workbench a    # a remark", "a1", "…", "solved in 2.0 ms",
        "$ quant-workbench b", "```", "```", "$ quant-workbench c"]
    lines2, blocks2 = tour.parse(text)
    again = tour.Run([[], [["a1", "a2", "solved in 9.9 ms"], ["b1"]], [["c1", "c2"]]], {})
    assert tour.differences(blocks2, again) == []
    drift = tour.Run([[], [["a1", "a2", "solved in 9.9 ms"], ["b1"]], [["c1", "c3"]]], {})
    [found] = tour.differences(blocks2, drift)
    assert "`$ quant-workbench c`" in found and "today:  c3" in found


@pytest.mark.slow     # the whole tour on MiniLM
def test_readme_tour_outputs_are_todays(tmp_path):
    lines, blocks = tour.parse(tour.README.read_text(encoding="utf-8"))
    result = tour.run(blocks, tmp_path)
    found = tour.differences(blocks, result)
    assert not found, ("README.md's tour differs from what its commands print today "
                       "(`quant-workbench bench-docs --readme` rewrites it):\n" + "\n".join(found))
