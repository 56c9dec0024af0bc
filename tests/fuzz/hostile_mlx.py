"""What the fuzz worker does with an mlx-lm folder spec (tests/fuzz/cases_mlx.py): writes it,
opens it and reads every tensor whole and by rows. A clean refusal is a one-line WorkbenchError
naming the folder (or a file in it); anything else (a traceback, a refusal naming nothing, a
shape that does not match what reading gives) is a Finding."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError

NP = {"U32": np.uint32, "I32": np.int32, "U8": np.uint8, "F16": np.float16, "F32": np.float32,
      "I8": np.int8, "BF16": np.uint16}


def _write(folder: Path, spec: dict) -> None:
    rng = np.random.default_rng(spec["seed"])
    mod = "model.layers.0.mlp.down_proj"
    tensors = {"model.norm.weight": ("F32", np.ones(8, np.float32))}
    for key, (dtype, shape) in spec["arrays"].items():
        n = int(np.prod(shape))
        if dtype in ("F16", "F32"):
            a = rng.standard_normal(n).astype(NP[dtype])
        else:
            a = rng.integers(0, 256 if dtype in ("U8", "I8") else 1 << 16, n).astype(NP[dtype])
        name = f"model.orphan.{'scales' if dtype == 'F16' else 'biases'}" if key == "orphan" \
            else f"{mod}.{key}"
        tensors[name] = (dtype, a.reshape(shape))
    header, data = {}, b""
    for name, (dtype, a) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [len(data), len(data) + a.nbytes]}
        data += a.tobytes()
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    (folder / "model.safetensors").write_bytes(len(blob).to_bytes(8, "little") + blob + data)
    cfg = {"model_type": "llama"}
    if spec["quantization"] is not None:
        cfg["quantization"] = spec["quantization"]
    (folder / "config.json").write_text(json.dumps(cfg))


def exercise_mlx(path: str) -> None:
    from workbench.formats.loaders import open_model
    from . import hostile
    spec = json.loads(Path(path).read_text())
    where = Path(tempfile.mkdtemp(prefix="qw-mlx-"))
    try:
        _write(where, spec)
        try:
            m = open_model(where)
        except WorkbenchError as exc:
            if str(where) not in str(exc):
                raise hostile.Finding(f"refusal names no file: {exc}") from None
            raise
        for name, info in m.tensors.items():
            got = m.read(name)
            if got.shape != tuple(info.shape) or got.dtype != np.float32:
                raise hostile.Finding(f"{name}: listed {info.shape}, read {got.shape} "
                                      f"{got.dtype}")
            rows = [c for _, c in m.iter_rows(name, max_elements=64)]
            if rows and not np.array_equal(np.concatenate(rows), m.read_matrix(name),
                                           equal_nan=True):
                raise hostile.Finding(f"{name}: rows read in chunks differ from the whole")
    finally:
        shutil.rmtree(where, ignore_errors=True)


EXERCISES = {"mlx": exercise_mlx}
