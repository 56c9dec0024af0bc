"""Calibration inputs: text (one sample a line), JSONL (a "text" field) or token ids
(.npy: 2-D ids or 1-D split into chunks; safetensors: an "input_ids" tensor). Text is tokenized
with the model folder's tokenizer (``tokenizer.json``, loaded with the `tokenizers` package: no
code executed). Results are cached by (file signature, tokenizer signature, limits)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress
from workbench.quant.stats import file_signature

DEFAULT_CALIB = Path(__file__).resolve().parents[2] / "resources" / "calibration.txt"
_CACHE: dict[tuple, list[np.ndarray]] = {}


MAX_CALIB_BYTES = 512 << 20      # a calibration text / JSONL file
MAX_LINE_CHARS = 1 << 20         # one sample (a line, or a JSONL "text"): a longer one is refused
MAX_TOKENS = 1 << 26             # token ids in an .npy / safetensors calibration file
CHARS_PER_TOKEN = 64             # text beyond max_len * this is never reached by max_len tokens


def _check_size(p: Path, limit: int, what: str) -> int:
    from workbench.core.limits import check_regular_file
    check_regular_file(p, what)
    size = p.stat().st_size
    if size > limit:
        raise WorkbenchError(f"{what} of {size:,} bytes is larger than the {limit >> 20} MiB "
                             "limit (calibration needs a few hundred samples)", path=str(p))
    return size


def read_utf8(p: Path, what: str = "calibration text") -> str:
    """The UTF-8 text of the regular file `p` (at most MAX_CALIB_BYTES), or a one-line
    WorkbenchError naming `what` it is."""
    _check_size(p, MAX_CALIB_BYTES, f"{what} file")
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise WorkbenchError(f"{what} is not UTF-8 (byte {exc.start:,})", path=str(p)) from None
    except OSError as exc:
        raise WorkbenchError(f"cannot read the {what} ({exc.strerror})", path=str(p)) from None


def read_texts(path) -> list[str]:
    p = Path(path)
    raw = read_utf8(p)
    if p.suffix.lower() in (".jsonl", ".json"):
        from workbench.core.limits import loads
        out = []
        for i, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                obj = loads(line, str(p), f"line {i}")
            except WorkbenchError:
                raise WorkbenchError(f"line {i}: not JSON (or nested too deeply)",
                                     path=str(p)) from None
            if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
                raise WorkbenchError(f"line {i}: no \"text\" string field", path=str(p))
            _check_line(p, i, obj["text"])
            out.append(obj["text"])
        return out
    out = []
    for i, ln in enumerate(raw.splitlines(), 1):
        if ln.strip():
            _check_line(p, i, ln)
            out.append(ln)
    return out


def _check_line(p: Path, i: int, text: str) -> None:
    if len(text) > MAX_LINE_CHARS:
        raise WorkbenchError(f"line {i} is {len(text):,} characters long (limit "
                             f"{MAX_LINE_CHARS:,}): split it into samples", path=str(p))


def _npy_ids(p: Path) -> np.ndarray:
    """The .npy array, its header checked against the file's size first (a header may claim
    any shape), memory-mapped; pickled object arrays are refused."""
    from numpy.lib import format as npf
    size = _check_size(p, 1 << 62, "token-id file")
    try:
        with open(p, "rb") as fh:
            version = npf.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = npf.read_array_header_1_0(fh, max_header_size=1 << 16)
            elif version in ((2, 0), (3, 0)):
                shape, fortran, dtype = npf.read_array_header_2_0(fh, max_header_size=1 << 16)
            else:
                raise ValueError(f"unsupported .npy version {version}")
            data_start = fh.tell()
    except Exception as exc:  # noqa: BLE001 - numpy parses an untrusted header many ways
        first = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
        raise WorkbenchError(f"not a valid .npy file ({first})", path=str(p)) from None
    if dtype.hasobject or dtype.kind not in "iu":
        raise WorkbenchError(f"token ids must be integers, not {dtype}", path=str(p))
    from workbench.core.limits import check_shape
    check_shape(shape, str(p), "token ids")
    n = 1
    for d in shape:
        n *= int(d)
    if n * dtype.itemsize > size - data_start:
        raise WorkbenchError(f"header claims {n:,} token ids ({n * dtype.itemsize:,} bytes) but "
                             f"the file holds {size - data_start:,} bytes of data", path=str(p))
    if n > MAX_TOKENS:
        raise WorkbenchError(f"{n:,} token ids (limit {MAX_TOKENS:,})", path=str(p))
    if n == 0:
        return np.zeros(shape, dtype)
    try:
        return np.load(p, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError) as exc:
        raise WorkbenchError(f"cannot read token ids ({str(exc).splitlines()[0][:120]})",
                             path=str(p)) from None


def _safetensors_ids(p: Path) -> np.ndarray:
    from workbench.formats.loaders.safetensors_format import _File
    f = _File(p)
    if "input_ids" not in f.entries:
        raise WorkbenchError("no 'input_ids' tensor", path=str(p))
    dtype, shape, begin, end = f.entries["input_ids"]
    if dtype not in ("I8", "I16", "I32", "I64", "U8", "U16", "U32", "U64"):
        raise WorkbenchError(f"token ids must be integers, not {dtype}", path=str(p),
                             tensor="input_ids")
    n = 1
    for d in shape:
        n *= int(d)
    if n > MAX_TOKENS:
        raise WorkbenchError(f"{n:,} token ids (limit {MAX_TOKENS:,})", path=str(p),
                             tensor="input_ids")
    return f.raw("input_ids")


def _read_ids(path, chunk: int) -> list[np.ndarray]:
    p = Path(path)
    arr = _npy_ids(p) if p.suffix.lower() == ".npy" else _safetensors_ids(p)
    if arr.dtype.kind not in "iu":
        raise WorkbenchError(f"token ids must be integers, not {arr.dtype}", path=str(p))
    if arr.ndim == 1:
        return [np.array(arr[i:i + chunk], dtype=np.int64) for i in range(0, len(arr), chunk)]
    if arr.ndim == 2:
        return [np.array(row[:chunk], dtype=np.int64) for row in arr if row.shape[0]]
    raise WorkbenchError(f"token ids must be 1-D or 2-D, not {arr.ndim}-D", path=str(p))


def vocab_size(model) -> int | None:
    """The model's vocabulary size (config.json's vocab_size, or its text_config's), None when
    the folder has no config.json or it names none. A config.json that cannot be read is a
    WorkbenchError naming it (never "unknown": the token ids would go unchecked)."""
    from workbench.formats.llama_names import model_folder
    cfg = model_folder(model) / "config.json"
    if not cfg.is_file():
        return None
    from workbench.running.runner_config import read_config
    c = read_config(model)
    v = c.get("vocab_size")
    if v is None and isinstance(c.get("text_config"), dict):
        v = c["text_config"].get("vocab_size")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def check_ids(samples: list[np.ndarray], vocab: int | None, path) -> None:
    """Every token id in [0, vocab): an id outside would index past the embedding table."""
    for i, s in enumerate(samples):
        if not s.size:
            continue
        lo, hi = int(s.min()), int(s.max())
        if lo < 0 or (vocab is not None and hi >= vocab):
            bad = lo if lo < 0 else hi
            raise WorkbenchError(f"sample {i + 1}: token id {bad:,} is outside the model's "
                                 f"vocabulary (0..{(vocab or 0) - 1:,})" if vocab else
                                 f"sample {i + 1}: negative token id {bad:,}", path=str(path))


def load_tokenizer(folder):
    tj = Path(folder) / "tokenizer.json"
    if not tj.is_file():
        raise WorkbenchError("no tokenizer.json in the model folder (give token ids instead: "
                             ".npy or safetensors)", path=str(folder))
    from workbench.core.optional import require
    Tokenizer = require("tokenizers", "model").Tokenizer
    from workbench.core.limits import check_sidecar
    check_sidecar(tj, "tokenizer.json")     # its size, before the tokenizers package reads it
    try:
        return Tokenizer.from_file(str(tj))
    except Exception as exc:  # noqa: BLE001 - the tokenizers package raises plain Exceptions
        why = (str(exc).splitlines() or [type(exc).__name__])[0][:200]
        raise WorkbenchError(f"the tokenizers package cannot load it ({why})",
                             path=str(tj)) from None


def calibration_samples(model, calib=None, samples: int | None = None, max_len: int = 128):
    """Job: list of int64 token-id arrays (one per sample, at most `max_len` tokens)."""
    from workbench.core.checks import MAX_SAMPLES, check_int
    from workbench.formats.llama_names import model_folder
    check_int("samples", samples, 1, MAX_SAMPLES, none=True)   # -3 would drop the last three
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
            # max_len tokens never reach past this prefix: the tokenizer's work is bounded
            t = t[:max_len * CHARS_PER_TOKEN]
            try:
                ids = np.asarray(tok.encode(t).ids, dtype=np.int64)[:max_len]
            except Exception as exc:  # noqa: BLE001 - a hostile tokenizer.json's model
                raise WorkbenchError(f"the tokenizer fails on sample {i + 1} ({str(exc)[:200]})",
                                     path=str(folder / "tokenizer.json")) from None
            if len(ids):
                out.append(ids)
    if samples:
        out = out[:samples]
    if not out:
        raise WorkbenchError("no calibration samples", path=str(calib))
    # ids from the model's own tokenizer that the vocabulary lacks are the tokenizer's fault
    check_ids(out, vocab_size(model), calib if calib.suffix.lower() in (".npy", ".safetensors")
              else folder / "tokenizer.json")
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
