"""llm-compressor's int4-g128 (W4A16) compressed-tensors exports of all-MiniLM-L6-v2, for
``python -m workbench.bench.ct_peer`` (docs/methods.md). Runs in a separate environment that has
llmcompressor installed (never the project's own):

    python3 -m venv /root/.venvs/llmc && /root/.venvs/llmc/bin/pip install torch==2.13.0 llmcompressor
    /root/.venvs/llmc/bin/python .ci/peer-llm-compressor.py MODEL_DIR CALIB_TXT OUT_DIR

writes OUT_DIR/rtn (QuantizationModifier) and OUT_DIR/gptq (GPTQModifier, calibrated on the
lines of CALIB_TXT, one sample per line), both with llm-compressor's defaults for the W4A16
preset scheme (symmetric int4, group 128, codes -8..7) on every Linear except the pooler (the
workbench's compressed-tensors export quantizes the same 36 attention and MLP projections).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main() -> None:
    import llmcompressor
    import torch
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from transformers import AutoModel, AutoTokenizer

    src, calib, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    lines = [ln for ln in Path(calib).read_text().splitlines() if ln.strip()]
    tok = AutoTokenizer.from_pretrained(src)
    enc = [tok(ln) for ln in lines]
    ds = Dataset.from_dict({k: [e[k] for e in enc] for k in enc[0].keys()})
    ignore = ["re:.*pooler.*"]
    for name, recipe, data in (
            ("rtn", QuantizationModifier(targets="Linear", scheme="W4A16", ignore=ignore), None),
            ("gptq", GPTQModifier(targets="Linear", scheme="W4A16", ignore=ignore), ds)):
        model = AutoModel.from_pretrained(src, dtype=torch.float32).eval()
        kw = {}
        if data is not None:
            kw = dict(dataset=data, num_calibration_samples=len(lines), max_seq_length=512,
                      pipeline="basic")
        oneshot(model=model, recipe=recipe, **kw)
        model.save_pretrained(out / name, save_compressed=True)
        tok.save_pretrained(out / name)
    (out / "versions.json").write_text(json.dumps(
        {"llmcompressor": llmcompressor.__version__, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
