"""Calibration inputs: text (one sample a line), JSONL (a "text" field) or token ids
(.npy: 2-D ids or 1-D split into chunks; safetensors: an "input_ids" tensor). Text is tokenized
with the model folder's tokenizer (``tokenizer.json``, loaded with the `tokenizers` package: no
code executed). Results are cached by (file signature, tokenizer signature, limits)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .errors import WorkbenchError
from .progress import Progress
from .stats import file_signature

DEFAULT_CALIB = Path(__file__).resolve().parents[1] / "resources" / "calibration.txt"
_CACHE: dict[tuple, list[np.ndarray]] = {}


def read_texts(path) -> list[str]:
    p = Path(path)
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkbenchError(f"cannot read calibration text ({exc})", path=str(p)) from None
    if p.suffix.lower() in (".jsonl", ".json"):
        out = []
        for i, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                raise WorkbenchError(f"line {i}: not JSON", path=str(p)) from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise WorkbenchError(f"line {i}: no \"text\" string field", path=str(p))
            out.append(obj["text"])
        return out
    return [ln for ln in raw.splitlines() if ln.strip()]


def _read_ids(path, chunk: int) -> list[np.ndarray]:
    p = Path(path)
    if p.suffix.lower() == ".npy":
        arr = np.load(p, allow_pickle=False)
    else:
        from safetensors.numpy import load_file
        d = load_file(str(p))
        if "input_ids" not in d:
            raise WorkbenchError("no 'input_ids' tensor", path=str(p))
        arr = d["input_ids"]
    arr = np.asarray(arr)
    if arr.dtype.kind not in "iu":
        raise WorkbenchError(f"token ids must be integers, not {arr.dtype}", path=str(p))
    if arr.ndim == 1:
        return [arr[i:i + chunk].astype(np.int64) for i in range(0, len(arr), chunk)]
    if arr.ndim == 2:
        return [row.astype(np.int64) for row in arr]
    raise WorkbenchError(f"token ids must be 1-D or 2-D, not {arr.ndim}-D", path=str(p))


def load_tokenizer(folder):
    tj = Path(folder) / "tokenizer.json"
    if not tj.is_file():
        raise WorkbenchError("no tokenizer.json in the model folder (give token ids instead: "
                             ".npy or safetensors)", path=str(folder))
    from .optional import require
    Tokenizer = require("tokenizers", "model").Tokenizer
    return Tokenizer.from_file(str(tj))


def calibration_samples(model, calib=None, samples: int | None = None, max_len: int = 128):
    """Job: list of int64 token-id arrays (one per sample, at most `max_len` tokens)."""
    from .runner import model_folder
    calib = Path(calib) if calib else DEFAULT_CALIB
    folder = model_folder(model)
    tsig = file_signature(str(folder / "tokenizer.json")) if (folder / "tokenizer.json").is_file() else None
    key = (str(calib), file_signature(str(calib)), str(folder), tsig, samples, max_len)
    if key in _CACHE:
        return _CACHE[key]
    yield Progress(0, 1, f"reading {calib.name}")
    if calib.suffix.lower() in (".npy", ".safetensors"):
        out = _read_ids(calib, max_len)
    else:
        texts = read_texts(calib)
        if samples:
            texts = texts[:samples]
        tok = load_tokenizer(folder)
        tok.no_truncation()
        tok.no_padding()
        out = []
        for i, t in enumerate(texts):
            if i % 32 == 0:
                yield Progress(i, len(texts), "tokenizing")
            ids = np.asarray(tok.encode(t).ids, dtype=np.int64)[:max_len]
            if len(ids):
                out.append(ids)
    if samples:
        out = out[:samples]
    if not out:
        raise WorkbenchError("no calibration samples", path=str(calib))
    _CACHE[key] = out
    yield Progress(1, 1, "tokenized")
    return out


def batches(samples: list[np.ndarray], batch_size: int = 16, pad_id: int = 0):
    """(ids, mask) int64 arrays, right-padded, in order."""
    for i in range(0, len(samples), batch_size):
        chunk = samples[i:i + batch_size]
        n = max(len(s) for s in chunk)
        ids = np.full((len(chunk), n), pad_id, dtype=np.int64)
        mask = np.zeros((len(chunk), n), dtype=np.int64)
        for j, s in enumerate(chunk):
            ids[j, :len(s)] = s
            mask[j, :len(s)] = 1
        yield ids, mask
