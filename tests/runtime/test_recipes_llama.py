"""recipe_assignment (llama-quantize's ftype rules encoded as data) against what the real
llama-quantize assigns (--dry-run) on the demo model and the real MiniLM."""

from __future__ import annotations

import re

import pytest

from workbench.export import export
from workbench.planning.frontier import recipe_assignment
from workbench.formats.llama_names import gguf_names
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run

from .conftest import ROOT, THREADS, run_tool

LINE = re.compile(r"^\[\s*\d+/\s*\d+\]\s+(\S+)\s+- \[.*?\], type =\s*(\S+), size = .*?"
                  r"(?:-> .*\((\S+)\))?\s*$")


def dry_run_types(llama_bin, gguf_path, ftype) -> dict[str, str]:
    r = run_tool(llama_bin, "llama-quantize", "--dry-run", gguf_path, ftype, THREADS)
    out = {}
    for line in (r.stdout + r.stderr).splitlines():
        m = LINE.match(line.strip())
        if m:
            out[m.group(1)] = (m.group(3) or m.group(2)).lower()
    assert out, (r.stdout + r.stderr)[-2000:]
    return out


@pytest.mark.parametrize("which", ["demo", "minilm"])
@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q5_K_M", "Q4_K_S", "Q6_K", "Q4_0"])
def test_recipe_matches_llama_quantize(llama_bin, minilm_folder, tmp_path_factory, which, ftype):
    folder = ROOT / "resources" / "demo_model" if which == "demo" else minilm_folder
    model = open_model(folder)
    f16 = tmp_path_factory.getbasetemp() / f"recipe-{which}-f16.gguf"
    if not f16.exists():
        run(export(model, Plan(default="fp16"), "gguf", f16))
    real = dry_run_types(llama_bin, f16, ftype)
    ours = recipe_assignment(model, ftype)
    names = gguf_names(model)
    ours_g = {names[n]: s for n, s in ours.items()}
    mine = {g: ("f16" if s == "fp16" else s) for g, s in ours_g.items()}
    retyped = {g: t for g, t in real.items() if t not in ("f32", "f16")
               or g in mine}
    assert mine == retyped, {g: (mine.get(g), real.get(g)) for g in set(mine) | set(retyped)
                             if mine.get(g) != real.get(g)}
    # every re-typed tensor of the real file is one we assign
    assert set(retyped) <= set(mine)
