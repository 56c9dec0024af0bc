"""Every input file of a model-level job, checked before any network is built or tokenizer
loaded (issue 47): the calibration and held-out inputs (a text's UTF-8, size and line lengths,
a JSONL's records, a .npy header's shape against the file's bytes, every token id against
config.json's vocab_size) and an imatrix (read within its bounds and matched against the
model's tensor names). The readers are calibration.py's and imatrix.py's own, so this early
check and the later read refuse the same files in the same words; the later read still checks
(a file replaced in between is refused then).

One call per entry point (workbench.api, the calibrate command): a calibration file already
checked for the same vocabulary is not read again (keyed by path, size and mtime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError

_DONE: dict[tuple, bool] = {}
_MAX_DONE = 256
ID_SUFFIXES = (".npy", ".safetensors")


def validate_calibration_inputs(model, calib=None, held_out=None, imatrix=None, *,
                                check: tuple[str, str] | None = None, say=None) -> None:
    """Refuse (a one-line WorkbenchError naming the file) a bad `calib`, `held_out` or `imatrix`
    of `model` before any work. `check`: the (runtime, scoring) of a check, whose measured text
    (`held_out`, else `calib`) llama.cpp and the chunked KL divergence of a causal LM read as
    one token stream (its lines may be of any length); every other text is read a sample a
    line. `say(line)` gets the warning for an imatrix that leaves weight matrices without
    importance."""
    from workbench.running.calibration import vocab_size

    def vocab():
        v = vocab_size(model)
        return (v, "config.json's vocab_size") if v else None
    _check_texts(vocab, calib, held_out,
                 lambda: _measured_as_stream(model, check))
    if imatrix:
        _check_imatrix(model, imatrix, say)


def validate_gguf_inputs(gguf_path, calib=None, held_out=None, *,
                         check: tuple[str, str] | None = None) -> None:
    """The calibration checks for a GGUF about to be converted to run (the CLI's
    workbench.export.convert.live: seconds of work), before the conversion: the vocabulary is
    its token_embd.weight's rows. `check`: as validate_calibration_inputs' (every GGUF run so
    is a causal LM)."""
    def vocab():
        from workbench.formats.loaders.gguf_format import open_gguf
        m = open_gguf(gguf_path)
        try:
            info = m.tensors.get("token_embd.weight")
            return (int(info.shape[0]), "token_embd.weight's rows") \
                if info is not None and info.ndim == 2 else None
        finally:
            m.close()
    _check_texts(vocab, calib, held_out,
                 lambda: check is not None and (check[0] == "llama.cpp" or check[1] == "chunks"))


def _check_texts(vocab, calib, held_out, streams) -> None:
    """`vocab()`: the vocabulary size (read only for token ids); `streams()`: whether the
    measured text (`held_out`, else `calib`) may be one token stream (asked only for a text
    that fails the line checks: it imports transformers)."""
    for path, measured in ((calib, not held_out), (held_out, True)):
        if not path:
            continue
        p = Path(path)
        try:
            _check_calibration_file(vocab, p, False)
        except WorkbenchError:
            if p.suffix.lower() in ID_SUFFIXES + (".jsonl", ".json") or not measured \
                    or not streams():
                raise
            _check_calibration_file(vocab, p, True)


def _measured_as_stream(model, check) -> bool:
    if check is None:
        return False
    runtime, scoring = check
    if runtime == "llama.cpp":
        return True
    if runtime != "torch" or scoring != "chunks":
        return False
    from workbench.running.runner_config import ENCODER_TYPES, model_kind, read_config
    try:
        cfg = read_config(model)
        archs = [a for a in cfg.get("architectures") or [] if isinstance(a, str)]
        if cfg.get("model_type") in ENCODER_TYPES and not any(
                a.endswith(("ForCausalLM", "LMHeadModel")) for a in archs):
            return False        # an encoder, as model_kind says, without importing transformers
        return model_kind(cfg) == "causal-lm"
    except WorkbenchError:
        return False            # not runnable: the check itself says so


def _signature(p: Path):
    from workbench.quant.stats import file_signature
    return file_signature(str(p))


def _remember(key: tuple) -> None:
    if len(_DONE) >= _MAX_DONE:
        _DONE.clear()
    _DONE[key] = True


def _check_calibration_file(vocab_of, p: Path, stream: bool) -> None:
    from workbench.running.calibration import _npy_ids, _safetensors_ids, read_texts, read_utf8
    suffix = p.suffix.lower()
    if suffix in ID_SUFFIXES:
        vocab = vocab_of()       # (size, where it comes from) or None
        key = ("ids", str(p), _signature(p), vocab)
        if key not in _DONE:
            arr = _npy_ids(p) if suffix == ".npy" else _safetensors_ids(p)
            check_id_array(arr, *(vocab or (None, "")), p)
            _remember(key)
        return
    key = ("stream" if stream else "lines", str(p), _signature(p))
    if key in _DONE:
        return
    if stream:
        read_utf8(p, "text")
    elif not read_texts(p):
        raise WorkbenchError("no calibration samples (no line holds text)", path=str(p))
    _remember(key)


def check_id_array(arr: np.ndarray, vocab: int | None, source: str, p) -> None:
    """A token-id array as the calibration reader takes it (1-D or 2-D integers, not empty)
    whose every id is in [0, vocab): an id outside would index past the embedding table.
    `source`: where `vocab` comes from (config.json's vocab_size, ...)."""
    if arr.dtype.kind not in "iu":
        raise WorkbenchError(f"token ids must be integers, not {arr.dtype}", path=str(p))
    if arr.ndim not in (1, 2):
        raise WorkbenchError(f"token ids must be 1-D or 2-D, not {arr.ndim}-D", path=str(p))
    if arr.size == 0:
        raise WorkbenchError("no calibration samples (no token ids)", path=str(p))
    lo, hi = int(arr.min()), int(arr.max())
    if lo >= 0 and (vocab is None or hi < vocab):
        return
    flat = np.asarray(arr).reshape(-1)
    bad_at = np.flatnonzero((flat < 0) | (flat >= vocab)) if vocab else np.flatnonzero(flat < 0)
    i = int(bad_at[0])
    where = (f"row {i // arr.shape[1] + 1:,}, column {i % arr.shape[1] + 1:,}" if arr.ndim == 2
             else f"position {i + 1:,}")
    bad = int(flat[i])
    raise WorkbenchError(f"token id {bad:,} at {where} is outside the model's vocabulary "
                         f"(0..{vocab - 1:,}, {source})" if vocab else
                         f"negative token id {bad:,} at {where}", path=str(p))


def _check_imatrix(model, imatrix, say) -> None:
    """Read and matched on every call (an imatrix is small, and its warning is said once per
    job: the callers check it once)."""
    from workbench.running.imatrix import imatrix_for_model, missing_note
    out, missing = imatrix_for_model(model, imatrix)
    if missing and say is not None:
        say(missing_note(imatrix, missing, len(out)))
