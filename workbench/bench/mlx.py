"""The default allocation against mlx-lm's own recipes, timed and judged in one run
(``quant-workbench bench-mlx MODEL``).

On one float Hugging Face folder (a GGUF is first converted to one with ``convert --to hf
--off-grid 0``, timed apart: a dequantized GGUF sits on its old grid) and one calibration
text:

(a) mlx-lm: ``python -m mlx_lm convert --hf-path MODEL -q`` for each recipe (uniform
    ``q4-g64``: 4 bits, group 64; ``mixed_3_6`` and ``mixed_4_6``: its
    ``--quant-predicate`` recipes), and with ``dynamic=X`` ``mlx_lm dynamic_quant
    --target-bpw X`` (its calibration text is ``~/.cache/mlx-lm/calibration_v5.txt``: the
    run puts the calibration text there when that file is absent, and refuses a different
    one), each a timed child process;
(b) the workbench, as a user runs it: ``quant-workbench allocate MODEL --target mlx
    --budget-of A --calib F -o plan.json`` (its defaults, plus --workbench-args) and
    ``quant-workbench export MODEL --plan plan.json --format mlx -o DIR`` for each folder A,
    child processes of the installed command;
(c) every folder judged by ``check --runtime mlx`` (workbench.export.mlx_check) on the
    held-out text: its tensors dequantized as mx.dequantize does, in torch, over the text
    (chunks of ``ctx``, the second half of each scored), and mlx-lm's own forward on the
    first ``mlx_chunks`` chunks.

The output folder keeps every folder, plan, log (logs/) and results.json.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from workbench.core.errors import WorkbenchError

#: recipe -> mlx_lm convert's arguments
RECIPES = {"q4-g64": ["--q-bits", "4", "--q-group-size", "64"],
           "mixed_3_6": ["--quant-predicate", "mixed_3_6"],
           "mixed_4_6": ["--quant-predicate", "mixed_4_6"]}
DEFAULT_RECIPES = tuple(RECIPES)
DEFAULT_TIMEOUT = 6 * 3600.0
MLX_CALIBRATION = Path("~/.cache/mlx-lm/calibration_v5.txt")


def parse_recipes(text: str) -> list[str]:
    out = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in out if t not in RECIPES]
    if not out or bad:
        raise WorkbenchError(f"--recipes {text!r}: choose from {', '.join(RECIPES)} "
                             "(separated by commas)")
    return list(dict.fromkeys(out))


def dynamic_calibration(calib: Path) -> Path:
    """mlx_lm dynamic_quant's calibration file, made the calibration text: written when
    absent, kept when it is the same text, a WorkbenchError when it differs (never replaced)."""
    target = MLX_CALIBRATION.expanduser()
    data = calib.read_bytes()
    if target.exists():
        if target.read_bytes() != data:
            raise WorkbenchError("mlx_lm dynamic_quant reads its calibration from this file, "
                                 "which holds another text: move it away to run --dynamic",
                                 path=str(target))
        return target
    from workbench.core.atomic import atomic_write
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(target, "wb") as fh:
        fh.write(data)
    return target


def bench_mlx(model, calib, held_out, out_dir, recipes=DEFAULT_RECIPES, ctx: int = 512,
              chunks: int | None = None, mlx_chunks: int = 1, mlx_ctx: int | None = None,
              dynamic: float | None = None,
              workbench_args: list[str] | None = None, timeout: float = DEFAULT_TIMEOUT):
    """The job (the module doc): yields Progress('[i/N] stage ...'); returns the results (also
    written to OUT/results.json). `out_dir` must be new or empty."""
    from workbench.bench.race import Race, prepare_out_dir, workbench_command
    from workbench.core import checks
    from workbench.export.mlx_check import check_float_model, check_mlx, folder_bytes
    from workbench.formats.loaders import open_model
    checks.check_int("ctx", ctx, checks.MIN_CTX, checks.MAX_CTX)
    checks.check_int("chunks", chunks, 1, checks.MAX_CHUNKS, none=True)
    checks.check_int("mlx_chunks", mlx_chunks, 1, checks.MAX_CHUNKS)
    checks.check_int("mlx_ctx", mlx_ctx, checks.MIN_CTX, checks.MAX_CTX, none=True)
    checks.check_float("timeout", timeout, 0.0, 1e7, lo_open=True, unit=" seconds")
    if dynamic is not None:
        checks.check_float("dynamic", dynamic, 1.0, 16.0)
    model, calib, held_out = Path(model), Path(calib), Path(held_out)
    gguf = False
    if model.is_file():
        with open(model, "rb") as fh:
            gguf = fh.read(4) == b"GGUF"
    if not model.is_dir() and not gguf:
        raise WorkbenchError("no such model folder (a float Hugging Face folder, or a GGUF "
                             "converted to one first)", path=str(model))
    for p in (calib, held_out):
        if not p.is_file():
            raise WorkbenchError("no such text file", path=str(p))
    if os.path.samefile(calib, held_out):
        raise WorkbenchError("the held-out text is the calibration text: judge on text the "
                             "calibration never saw", path=str(held_out))
    if not gguf:
        check_float_model(open_model(model))
    if dynamic is not None:
        dynamic_calibration(calib)
    out = prepare_out_dir(out_dir)
    qw = workbench_command()
    mlx_lm = [sys.executable, "-m", "mlx_lm"]
    extra = list(workbench_args or [])
    names = [*recipes, *([f"dynamic-{dynamic:g}"] if dynamic is not None else [])]
    n_steps = 4 * len(names) + gguf    # (convert), mlx-lm, allocate, export, 2 judged
    res = {"model": str(model), "calib": str(calib), "held_out": str(held_out), "ctx": ctx,
           "chunks_limit": chunks, "mlx_chunks": mlx_chunks, "mlx_ctx": mlx_ctx,
           "recipes": names,
           "workbench_args": extra, "out_dir": str(out), "workbench": qw}
    race = Race(out, n_steps, timeout, res)
    save = race.save

    def step(cmd, log_name, label):
        return round((yield from race.step(cmd, log_name, label)), 1)

    if gguf:
        hf = out / "float-hf"
        res["convert"] = {"source": str(model), "folder": hf.name, "wall_s": (yield from step(
            [*qw, "convert", model, "--to", "hf", hf, "--off-grid", "0"], "convert.log",
            "convert the GGUF --to hf --off-grid 0"))}
        model = hf
        res["model"] = str(model)
        save()
    float_model = open_model(model)
    check_float_model(float_model)
    # (a) mlx-lm's own folders
    for name in names:
        folder = out / f"mlx-lm-{name}"
        if name in RECIPES:
            cmd = [*mlx_lm, "convert", "--hf-path", model, "--mlx-path", folder, "-q",
                   *RECIPES[name]]
        else:
            cmd = [*mlx_lm, "dynamic_quant", "--model", model, "--mlx-path", folder,
                   "--target-bpw", f"{dynamic:g}"]
        t = yield from step(cmd, f"mlx-lm-{name}.log", f"mlx-lm {name}")
        res["rows"].append({"label": f"mlx-lm {name}", "recipe": name, "kind": "mlx-lm",
                            "folder": folder.name, "bytes": folder_bytes(folder),
                            "wall_s": t})
        save()
    # (b) the workbench at each one's bytes
    for name in names:
        base = out / f"mlx-lm-{name}"
        plan = out / f"plan-{name}.json"
        folder = out / f"workbench-{name}"
        row = {"label": f"workbench at {name}'s bytes", "recipe": name, "kind": "workbench",
               "folder": folder.name, "plan": plan.name}
        res["rows"].append(row)
        if not (yield from race.allocate_export(
                row, name, [*qw, "allocate", model, "--target", "mlx", "--budget-of", base,
                            "--calib", calib, "-o", plan, *extra],
                [*qw, "export", model, "--plan", plan, "--format", "mlx", "-o", folder])):
            continue
        row["bytes"] = folder_bytes(folder)
        row["wall_s"] = round(row["allocate_s"] + row["export_s"], 1)
        save()
    # (c) the judge
    def score(row, tag):
        r = yield from check_mlx(float_model, None, held_out, ctx, chunks=chunks,
                                 folder=out / row["folder"], mlx_chunks=mlx_chunks,
                                 mlx_ctx=mlx_ctx)
        row["kld"] = r["kld"]
        row["mlx"] = r["mlx"]
        row["judge_s"] = r["seconds"]

    yield from race.judge(lambda row: f"judge {row['label']}", score)
    return (yield from race.finish())


def table(res: dict) -> str:
    """One table: folder, bytes, mean / 99.9 % KLD, same top-1 %, PPL ratio (torch, the whole
    held-out text), mlx-lm's own mean KLD and top-1 on its chunks, wall time."""
    from workbench.bench.race import fmt, fmt_load
    conv = res.get("convert")
    name = Path(conv["source"]).name + " (convert --off-grid)" if conv else Path(res["model"]).name
    rows = res["rows"]
    m0 = next((r["mlx"] for r in rows if "mlx" in r), None)
    lines = [f"{name}: held-out {Path(res['held_out']).name} ({res.get('tokens')} tokens scored "
             f"in {res.get('chunks')} chunks of {res['ctx']}), calibration "
             f"{Path(res['calib']).name}, {os.cpu_count()} cores, load "
             f"{fmt_load(res.get('load_before'))} before, {fmt_load(res.get('load_after'))} "
             "after",
             "",
             "| folder | bytes | mean KLD | 99.9% KLD | top-1 % | PPL ratio | mlx-lm mean KLD "
             "| mlx-lm top-1 % | wall s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        k = r.get("kld") or {}
        m = (r.get("mlx") or {}).get("kld") or {}
        if r["kind"] == "workbench" and "error" not in r:
            wall = f"{r['wall_s']:.1f} ({r['allocate_s']:.1f} + {r['export_s']:.1f})"
        else:
            wall = fmt(r.get("wall_s"), ".1f")
        label = r["label"] + (f" ({r['error']})" if "error" in r else "")
        lines.append(f"| {label} | {fmt(r.get('bytes'), ',')} | {fmt(k.get('mean'), '.4f')} | "
                     f"{fmt(k.get('p999'), '.3f')} | {fmt(k.get('same_top1'), '.1f')} | "
                     f"{fmt(k.get('ppl_ratio'), '.3f')} | {fmt(m.get('mean'), '.4f')} | "
                     f"{fmt(m.get('same_top1'), '.1f')} | {wall} |")
    notes = ["", "mean / 99.9% KLD, top-1, PPL ratio: each folder's tensors dequantized as "
             "mx.dequantize does, run in torch over the held-out text; mlx-lm columns: "
             "mlx_lm.load and its own forward"]
    if m0:
        a = m0["agreement"]["float"]
        notes[-1] += (f" on the first {m0['chunks']} chunk(s) ({m0['tokens']} tokens), against "
                      f"mlx-lm's float model in float32. mlx-lm's and transformers' float "
                      f"forwards (float32) differ by a mean KL of {a['mean']:.3g} (99.9% "
                      f"{a['p999']:.3g}, same top-1 {a['same_top1']:.1f} %) on those tokens")
    notes[-1] += (". wall s: mlx-lm = its convert; workbench = allocate + export. "
                  f"Folders and logs: {res['out_dir']}")
    return "\n".join(lines + notes)
