"""Quantize speed against llama-quantize on the same GGUF, same types, same thread count.

    quant-workbench bench --vs-llama-quantize F16.gguf [--types q8_0,q4_k] [--threads N]

For each type: llama-quantize (a subprocess, wall time; it reads the file, quantizes and writes
the output) re-types the F16 model; its output tells which tensors it quantized and to which
type (its fallbacks included). The workbench then quantizes exactly those tensors to exactly
those types from the same F16 data, with the numba kernels on N threads (sequential over
tensors, each tensor parallel over rows), timed two ways: the quantize calls alone, and
read (F16 -> float32) + quantize. Ratios > 1 mean the workbench is faster. Both runs are in
one process run, on the same machine, back to back.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time

import numpy as np


def llama_bin_dir() -> str | None:
    """The llama.cpp bin dir from ..ci/llama-cpp's cache (None when it is not built)."""
    base = os.path.expanduser("~/.cache/quant-workbench/llama-cpp-python-0.3.36")
    b = os.path.join(base, "build", "bin")
    if os.path.exists(os.path.join(base, ".built")) and os.path.exists(os.path.join(b, "llama-quantize")):
        return b
    return None


def make_llama_f16_gguf(path: str, hidden: int = 1024, mlp: int = 2816, layers: int = 24,
                        vocab: int = 32000, seed: int = 0) -> dict:
    """Write a Llama-shaped F16 GGUF that llama.cpp loads, for timing on a large model: random
    weights (normal, std 0.02; norms 1), the demo model's BPE tokenizer padded to `vocab`,
    written as a Hugging Face folder (config.json, float16 safetensors) in a temporary folder
    and exported with `export --scheme fp16 --format gguf`. The defaults give 373.9 M
    parameters (a 748 MB file). Returns {"path", "params"}."""
    import json
    import shutil
    from pathlib import Path

    from workbench.export import export
    from workbench.export.st_writer import StreamingSafetensorsWriter
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run

    demo = Path(__file__).resolve().parents[2] / "resources" / "demo_model"
    heads = max(1, hidden // 64)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
              "hidden_size": hidden, "intermediate_size": mlp, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": vocab,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "torch_dtype": "float16", "hidden_act": "silu"}
    rng = np.random.default_rng(seed)
    pool = (rng.standard_normal(1 << 24, dtype=np.float32) * np.float32(0.02)).astype(np.float16)
    params = 0
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(path))) as tmp:
        folder = Path(tmp)
        (folder / "config.json").write_text(json.dumps(config))
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(demo / name, folder / name)
        w = StreamingSafetensorsWriter(folder / "model.safetensors", {"format": "pt"})

        def add(name, shape):
            nonlocal params
            n = int(np.prod(shape))
            arr = (np.ones(n, np.float16) if len(shape) == 1 else
                   np.resize(np.roll(pool, int(rng.integers(0, pool.size))), n))
            w.add(name, arr.reshape(shape), dtype="F16")
            params += n

        add("model.embed_tokens.weight", (vocab, hidden))
        for i in range(layers):
            p = f"model.layers.{i}."
            add(p + "input_layernorm.weight", (hidden,))
            for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
                add(p + f"self_attn.{proj}.weight", (hidden, hidden))
            add(p + "post_attention_layernorm.weight", (hidden,))
            add(p + "mlp.gate_proj.weight", (mlp, hidden))
            add(p + "mlp.up_proj.weight", (mlp, hidden))
            add(p + "mlp.down_proj.weight", (hidden, mlp))
        add("model.norm.weight", (hidden,))
        add("lm_head.weight", (vocab, hidden))
        w.finish()
        run(export(open_model(folder), Plan("fp16", []), "gguf", path))
    return {"path": path, "params": params}


def _retyped(path: str) -> list[tuple[str, str]]:
    """(tensor name, GGML type name) of every quantized tensor in a GGUF."""
    import gguf
    r = gguf.GGUFReader(path)
    keep = {"F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64"}
    return [(t.name, t.tensor_type.name) for t in r.tensors if t.tensor_type.name not in keep]


def run_vs_llama_quantize(src: str, types: list[str], threads: int, repeats: int = 3,
                          bindir: str | None = None, progress=None) -> dict:
    import gguf
    import numba

    from pathlib import Path

    from workbench.export.llama_tools import tool_env, usable
    from workbench.quant import accel
    from workbench.schemes import get_scheme

    say = progress or (lambda m: None)
    bindir = bindir or llama_bin_dir()
    if bindir is None:
        raise RuntimeError("llama-quantize is not built (run `bash .ci/llama-cpp` first)")
    tool = os.path.join(bindir, "llama-quantize")
    usable(Path(tool), "llama-quantize")          # not executable: one line saying how to fix
    reader = gguf.GGUFReader(src)
    data = {t.name: t for t in reader.tensors}
    prev = numba.get_num_threads()
    numba.set_num_threads(max(1, min(threads, numba.config.NUMBA_NUM_THREADS)))
    rows_out = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for ty in types:
                out = os.path.join(tmp, f"lq-{ty}.gguf")
                say(f"llama-quantize {ty.upper()} ({threads} threads)")
                lq, lq_cpu = [], []
                for _ in range(repeats):
                    c0 = _children_cpu()
                    t0 = time.perf_counter()
                    p = subprocess.run([tool, src, out, ty.upper(), str(threads)],
                                       capture_output=True, text=True, env=tool_env(bindir))
                    lq.append(time.perf_counter() - t0)
                    lq_cpu.append(_children_cpu() - c0)
                    if p.returncode != 0:
                        raise RuntimeError(f"llama-quantize failed: {p.stderr.strip()[-300:]}")
                todo = _retyped(out)
                f32 = {}
                for name, _ in todo:
                    t = data[name]
                    f32[name] = np.asarray(t.data).astype(np.float32).reshape(
                        [int(x) for x in reversed(t.shape.tolist())])
                nbytes = sum(a.size * 4 for a in f32.values())
                # warm the kernels (compile or cache load) outside the timing
                for tname, name in {tn: n for n, tn in todo}.items():
                    accel.quantize(get_scheme(tname.lower()), f32[name][:1], backend="cpu")
                say(f"workbench {ty} ({len(todo)} tensors)")
                ours_q, ours_rq = [], []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for name, tname in todo:
                        accel.quantize(get_scheme(tname.lower()), f32[name], backend="cpu")
                    ours_q.append(time.perf_counter() - t0)
                    t0 = time.perf_counter()
                    for name, tname in todo:
                        t = data[name]
                        w = np.asarray(t.data).astype(np.float32)
                        accel.quantize(get_scheme(tname.lower()), w.reshape(f32[name].shape),
                                         backend="cpu")
                    ours_rq.append(time.perf_counter() - t0)
                kinds = sorted({tn for _, tn in todo})
                say(f"quant-workbench export ({threads} threads)")
                ex, ex_cpu = _time_export(src, todo, ty, threads, tmp, repeats)
                ex_in = _time_export_in_process(src, todo, ty, tmp, repeats)
                lq_s, q_s, rq_s = min(lq), min(ours_q), min(ours_rq)
                rows_out.append({
                    "type": ty, "tensors": len(todo), "ggml_types": kinds,
                    "mbytes_f32": nbytes / 1e6,
                    "llama_quantize_s": lq_s, "ours_quantize_s": q_s, "ours_read_quantize_s": rq_s,
                    "ours_mbps": nbytes / q_s / 1e6,
                    "ratio_quantize": lq_s / q_s, "ratio_read_quantize": lq_s / rq_s,
                    "export_s": ex, "ratio_export": lq_s / ex,
                    "export_in_process_s": ex_in, "ratio_export_in_process": lq_s / ex_in,
                    "llama_quantize_cpu_s": min(lq_cpu), "export_cpu_s": ex_cpu,
                    "ratio_export_cpu": min(lq_cpu) / ex_cpu if ex_cpu > 0 else float("inf")})
                say(format_row(rows_out[-1]))
    finally:
        numba.set_num_threads(prev)
    return {"source": src, "threads": threads, "repeats": repeats, "rows": rows_out}


def _time_export(src: str, todo, ty: str, threads: int, tmp: str, repeats: int) -> float:
    """Best wall time of `quant-workbench export SRC --plan P --format gguf --threads N` as a
    process (start-up, read, quantize, write, fsync), where the plan gives every tensor
    llama-quantize re-typed the type it chose and keeps the rest: the same file content.
    Returns (best wall s, least CPU s of a run: user + system, all threads)."""
    import json
    import sys
    plan = {"format": "quant-workbench-plan", "version": 1, "default": "keep",
            "rules": [{"match": name, "scheme": tname.lower()} for name, tname in todo]}
    plan_path = os.path.join(tmp, f"plan-{ty}.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f)
    out = os.path.join(tmp, f"qw-{ty}.gguf")
    cmd = [sys.executable, "-c", "import sys; from workbench.cli import main; sys.exit(main())",
           "export", src, "--plan", plan_path, "--format", "gguf", "-o", out,
           "--threads", str(threads)]
    best = best_cpu = float("inf")
    for _ in range(repeats):
        if os.path.exists(out):
            os.remove(out)
        c0 = _children_cpu()
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True)
        best = min(best, time.perf_counter() - t0)
        best_cpu = min(best_cpu, _children_cpu() - c0)
        if p.returncode != 0:
            raise RuntimeError(f"quant-workbench export failed: {p.stderr.strip()[-300:]}")
    got = dict(_retyped(out))
    want = {n: t for n, t in todo}
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))[:3]
        raise RuntimeError(f"the export's types differ from llama-quantize's: {diff}")
    return best, best_cpu


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes so far."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _time_export_in_process(src: str, todo, ty: str, tmp: str, repeats: int) -> float:
    """Best wall time of the same export in this process after one warm-up run (the file is
    opened, every tensor quantized and written and the file fsynced each time; what is left
    out is the interpreter's start and the one-time imports/kernel loads)."""
    from workbench.export import export
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    plan = Plan("keep", [{"match": name, "scheme": tname.lower()} for name, tname in todo])
    out = os.path.join(tmp, f"qw-in-{ty}.gguf")
    best = float("inf")
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        run(export(open_model(src), plan, "gguf", out))
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


def format_row(r: dict) -> str:
    nan = float("nan")
    return (f"{r['type']:8} {r['tensors']:7d} {r['mbytes_f32']:8.1f} "
            f"{r['llama_quantize_s']:10.3f} {r['ours_quantize_s']:9.3f} "
            f"{r['ours_read_quantize_s']:9.3f} {r['ours_mbps']:9.0f} "
            f"{r['ratio_quantize']:6.2f} {r['ratio_read_quantize']:7.2f} "
            f"{r['export_s']:9.3f} {r['ratio_export']:7.2f} "
            f"{r['export_in_process_s']:9.3f} {r['ratio_export_in_process']:5.2f} "
            f"{r.get('llama_quantize_cpu_s', nan):9.3f} {r.get('export_cpu_s', nan):9.3f} "
            f"{r.get('ratio_export_cpu', nan):7.2f}  {','.join(r['ggml_types'])}")


def format_table(rep: dict) -> str:
    lines = [f"{rep['source']}: {rep['threads']} thread(s), best of {rep['repeats']}",
             f"{'type':8} {'tensors':>7} {'MB f32':>8} {'llama-q s':>10} {'ours q s':>9} "
             f"{'read+q s':>9} {'ours MB/s':>9} {'x (q)':>6} {'x (r+q)':>7} {'export s':>9} "
             f"{'x (exp)':>7} {'in-proc s':>9} {'x':>5} {'lq cpu s':>9} {'exp cpu s':>9} "
             f"{'x (cpu)':>7}  types"]
    lines.extend(format_row(r) for r in rep["rows"])
    lines.append("x > 1: the workbench is faster. llama-q s and export s are wall times of "
                 "whole processes (start, read, quantize, write): llama-quantize and "
                 "`quant-workbench export --format gguf --threads N` writing the same types; "
                 "in-proc s: that export run inside this process (warm: no interpreter start, "
                 "imports or kernel loading). lq cpu s / exp cpu s: the least user + system CPU "
                 "time of one such process (all its threads), steadier than wall time on a "
                 "shared machine.")
    return "\n".join(lines)
