"""The default allocation against llama.cpp's own pipeline, timed and judged in one run
(``quant-workbench bench-allocate --vs-llama MODEL``).

On one float Hugging Face folder and one calibration text:

(a) llama.cpp: an F16 GGUF by the project's exporter (``export --scheme fp16 --format gguf``,
    timed apart: both pipelines start from the float folder, only llama.cpp's needs it), then
    ``llama-imatrix`` on the calibration text and ``llama-quantize --imatrix`` for each type;
(b) the workbench, as a user runs it: ``quant-workbench allocate MODEL --budget-of
    LLAMA-TYPE.gguf --calib F -o plan.json`` (its defaults, plus --workbench-args) and
    ``quant-workbench export MODEL --plan plan.json --format gguf``, child processes of the
    installed command;
(c) every file judged by ``llama-perplexity --kl-divergence`` (workbench.export.llama_kld) on the
    held-out text against the F16 file's base logits.

Wall times: llama.cpp's = imatrix + quantize (the imatrix counted in full for each type, as a
user making one file pays it); the workbench's = allocate + export; the ratio is workbench /
llama.cpp. The output folder keeps every file: the GGUFs, the imatrix, the plans, base.kld,
each tool's log (logs/) and results.json.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from workbench.export import llama_kld as lk
from workbench.export.llama_tools import tool_threads, usable
from workbench.core.errors import WorkbenchError
from workbench.bench.race import Race, fmt, fmt_load, prepare_out_dir, workbench_command

DEFAULT_TYPES = ("Q4_K_M", "Q3_K_M", "IQ4_NL")


def parse_types(text: str) -> list[str]:
    types = [t.strip().upper() for t in text.split(",") if t.strip()]
    bad = [t for t in types if not re.fullmatch(r"[A-Z0-9_]+", t)]
    if not types or bad:
        raise WorkbenchError(f"--types {text!r}: expected llama-quantize type names separated by "
                             "commas (e.g. Q4_K_M,Q3_K_M,IQ4_NL)")
    return list(dict.fromkeys(types))


def vs_llama(model, calib, held_out, out_dir, types=DEFAULT_TYPES, ctx: int = lk.DEFAULT_CTX,
             chunks: int | None = None, threads: int | None = None,
             workbench_args: list[str] | None = None, timeout: float = lk.DEFAULT_TIMEOUT):
    """The job (see the module docstring): yields Progress('[i/N] stage ...') at least every 2
    s; returns the results (also written to OUT/results.json). `out_dir` must be new or
    empty."""
    from workbench.core import checks
    checks.check_int("ctx", ctx, checks.MIN_CTX, checks.MAX_CTX)
    checks.check_int("chunks", chunks, 1, checks.MAX_CHUNKS, none=True)
    threads = tool_threads(threads)                 # (None: $OMP_NUM_THREADS, else 2)
    checks.check_int("threads", threads, 1, checks.MAX_THREADS)
    checks.check_float("timeout", timeout, 0.0, 1e7, lo_open=True, unit=" seconds")
    model, calib, held_out = Path(model), Path(calib), Path(held_out)
    if not model.exists():
        raise WorkbenchError("no such model folder or file", path=str(model))
    for p in (calib, held_out):
        if not p.is_file():
            raise WorkbenchError("no such text file", path=str(p))
    if os.path.samefile(calib, held_out):
        raise WorkbenchError("the held-out text is the calibration text: judge on text the "
                             "calibration never saw", path=str(held_out))
    bin_dir = lk.llama_bin("llama-perplexity")
    for tool in ("llama-imatrix", "llama-quantize"):
        if not usable(bin_dir / tool, tool):        # (not executable: an error saying so)
            raise WorkbenchError(f"no {tool} in {bin_dir}: build the tools with "
                                 "`bash .ci/llama-cpp`")
    out = prepare_out_dir(out_dir)
    qw = workbench_command()
    env = lk.tool_env(bin_dir)
    extra = list(workbench_args or [])
    n_steps = 4 + 5 * len(types)      # f16, imatrix, base, f16 KLD + per type: quantize,
    #                                   allocate, export, 2 KLD
    res = {"model": str(model), "calib": str(calib), "held_out": str(held_out), "ctx": ctx,
           "chunks_limit": chunks, "threads": threads, "types": list(types),
           "workbench_args": extra, "out_dir": str(out), "llama_bin": str(bin_dir),
           "workbench": qw}
    race = Race(out, n_steps, timeout, res)
    step, save, cpu, logs = race.step, race.save, race.cpu, race.logs

    # (a) llama.cpp's pipeline
    f16 = out / "float-f16.gguf"
    t = yield from step([*qw, "export", model, "--scheme", "fp16", "--format", "gguf",
                         "-o", f16], "export-f16.log", "export the F16 GGUF")
    res["f16"] = {"file": f16.name, "bytes": f16.stat().st_size, "export_s": t,
                  "export_cpu_s": cpu["export-f16.log"]}
    imatrix = out / "imatrix.gguf"
    t = yield from step([bin_dir / "llama-imatrix", "-m", f16, "-f", calib, "-o", imatrix,
                         "-c", ctx, "-t", threads], "llama-imatrix.log", "llama-imatrix",
                        env, lk.chunk_status())
    res["imatrix_s"], res["imatrix_cpu_s"] = t, cpu["llama-imatrix.log"]
    llama_files = {}
    for ty in types:
        q = out / f"llama-{ty}-imatrix.gguf"
        t = yield from step([bin_dir / "llama-quantize", "--imatrix", imatrix, f16, q, ty,
                             threads], f"llama-quantize-{ty}.log", f"llama-quantize {ty}", env)
        llama_files[ty] = q
        res["rows"].append({"label": f"llama.cpp {ty} + imatrix", "type": ty, "kind": "llama.cpp",
                            "file": q.name, "bytes": q.stat().st_size, "imatrix_s": res["imatrix_s"],
                            "quantize_s": t, "wall_s": res["imatrix_s"] + t,
                            "cpu_s": res["imatrix_cpu_s"] + cpu[f"llama-quantize-{ty}.log"]})
    save()

    # (b) the workbench, as a user runs it
    for ty in types:
        plan = out / f"plan-{ty}.json"
        q = out / f"workbench-{ty}.gguf"
        row = {"label": f"workbench at {ty}'s bytes", "type": ty, "kind": "workbench",
               "file": q.name, "plan": plan.name}
        res["rows"].append(row)
        if not (yield from race.allocate_export(
                row, ty, [*qw, "allocate", model, "--budget-of", llama_files[ty], "--calib",
                          calib, "-o", plan, *extra],
                [*qw, "export", model, "--plan", plan, "--format", "gguf", "-o", q])):
            continue
        row["bytes"] = q.stat().st_size
        row["wall_s"] = row["allocate_s"] + row["export_s"]
        row["cpu_s"] = cpu[f"allocate-{ty}.log"] + cpu[f"export-{ty}.log"]
        with_llama = next(r for r in res["rows"] if r["kind"] == "llama.cpp" and r["type"] == ty)
        row["time_ratio"] = row["wall_s"] / with_llama["wall_s"]
        row["cpu_ratio"] = row["cpu_s"] / with_llama["cpu_s"] if with_llama["cpu_s"] else None
        save()

    # (c) the judge: llama-perplexity KLD on the held-out text
    tag, ev = race.begin("llama-perplexity base logits (F16, held-out text)")
    yield ev
    base = yield from lk.base_logits(f16, held_out, ctx, chunks=chunks, threads=threads,
                                     out_path=out / "base.kld", log=logs / "base.log",
                                     timeout=timeout, label=tag)
    res["base"] = {"file": "base.kld", "bytes": base["path"].stat().st_size,
                   "ppl_base": base["ppl_base"], "seconds": base["seconds"]}
    tag, ev = race.begin("KLD of the F16 file against itself (the floor)")
    yield ev
    k = yield from lk.score(f16, base["path"], ctx, threads=threads, log=logs / "kld-f16.log",
                            timeout=timeout, label=tag)
    res["f16"]["kld_s"] = k.pop("seconds")
    k.pop("bytes")
    res["f16"]["kld"] = k
    save()

    def score(row, tag):
        try:
            k = yield from lk.score(out / row["file"], base["path"], ctx, threads=threads,
                                    log=logs / f"kld-{Path(row['file']).stem}.log",
                                    timeout=timeout, label=tag)
        except WorkbenchError as exc:
            if row["kind"] != "workbench":
                raise
            row["error"] = f"llama-perplexity: {exc.problem}"
            return
        row["kld_s"] = k.pop("seconds")
        k.pop("bytes")
        row["kld"] = k

    yield from race.judge(lambda row: f"KLD {row['label']}", score)
    return (yield from race.finish())


def table(res: dict) -> str:
    """One table: file, bytes, mean KLD, 99.9% KLD, top-1 %, PPL ratio, wall time, ratio."""
    name = Path(res["model"]).name
    lines = [f"{name}: held-out {Path(res['held_out']).name} ({res.get('tokens')} tokens scored "
             f"in {res.get('chunks')} chunks of {res['ctx']}), calibration "
             f"{Path(res['calib']).name}, llama.cpp tools on {res['threads']} threads, "
             f"{os.cpu_count()} cores, load {fmt_load(res.get('load_before'))} before, "
             f"{fmt_load(res.get('load_after'))} after",
             "",
             "| file | bytes | mean KLD | 99.9% KLD | top-1 % | PPL ratio | wall s | CPU s "
             "| × wall | × CPU |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    f16 = dict(res.get("f16") or {}, label="F16 against itself (export time)", kind="f16",
               wall_s=(res.get("f16") or {}).get("export_s"),
               cpu_s=(res.get("f16") or {}).get("export_cpu_s"))
    for r in [f16, *res["rows"]]:
        k = r.get("kld") or {}
        top = k.get("same_top1")
        if r["kind"] == "llama.cpp":
            wall = f"{r['wall_s']:.1f} ({r['imatrix_s']:.1f} + {r['quantize_s']:.1f})"
        elif "error" in r or r["kind"] == "f16":
            wall = fmt(r.get("wall_s"), ".1f")
        else:
            wall = f"{r['wall_s']:.1f} ({r['allocate_s']:.1f} + {r['export_s']:.1f})"
        ratio = fmt(r.get("time_ratio"), ".1f") + ("×" if r.get("time_ratio") else "")
        cratio = fmt(r.get("cpu_ratio"), ".1f") + ("×" if r.get("cpu_ratio") else "")
        label = r["label"] + (f" ({r['error']})" if "error" in r else "")
        lines.append(f"| {label} | {fmt(r.get('bytes'), ',')} | {fmt(k.get('mean'), '.4f')} | "
                     f"{fmt(k.get('p999'), '.3f')} | {fmt(top, '.1f')} | "
                     f"{fmt(k.get('ppl_ratio'), '.3f')} | {wall} | {fmt(r.get('cpu_s'), '.1f')} | "
                     + (f"{ratio} | {cratio} |" if r["kind"] == "workbench" else " | |"))
    lines += ["", "wall s: llama.cpp = llama-imatrix + llama-quantize; workbench = allocate + "
              "export; CPU s: the same steps' user + system CPU time; × = workbench / "
              "llama.cpp. PPL ratio as llama-perplexity prints it: "
              "PPL(base) comes from its stored log-probabilities, clipped 16 nats below each "
              "token's top logit, so the F16 row shows the ratio's floor (the F16 run's own "
              f"PPL: {fmt((res.get('base') or {}).get('ppl_base'), '.4f')}). "
              f"Files and logs: {res['out_dir']}"]
    return "\n".join(lines)
