"""Checkpoints whose weights are stored block-scaled, opened as their dequantized float32
tensors (lazily, one tensor at a time, exactly):

* DeepSeek-V3-style FP8 (``config.json`` ``quantization_config``: ``quant_method: fp8``,
  ``weight_block_size: [bh, bw]``): ``<layer>.weight`` float8_e4m3fn [out, in] and
  ``<layer>.weight_scale_inv`` float32 [⌈out/bh⌉, ⌈in/bw⌉]; w = fp8 · scale_inv of its block
  (the name notwithstanding, the stored value multiplies: DeepSeek's ``weight_dequant`` and
  transformers' FP8 integration do so).
* gpt-oss-style MXFP4 (``quant_method: mxfp4``): ``<name>_blocks`` uint8 [*prefix, G, 16] and
  ``<name>_scales`` uint8 [*prefix, G]; each byte holds two E2M1 codes (low nibble first) of a
  32-value group, scaled by 2^(scale−127), the groups concatenated along the last axis, and
  (as transformers' ``integrations/mxfp4.py`` hands them to the model) the last two axes of a
  3-D result transposed: ``<name>`` [E, G·32, out] for experts [E, out, G·32].
  Exact in float32 (transformers computes the same products in bfloat16, which holds them).

Opened by ``open_model`` when the folder's ``config.json`` says so (``source_kind``); headers are
checked up front (shapes, dtypes, block sizes): a hostile one is a one-line WorkbenchError.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.formats.model import Model, TensorInfo

_FP4 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def source_kind(path) -> str | None:
    """"compressed-tensors", "fp8-block" or "mxfp4-blocks" for a folder (or a file in one)
    whose config.json declares that quantization; None otherwise."""
    from workbench.formats.loaders.sidecar import folder_config
    found = folder_config(path)
    if found is None:
        return None
    data = found[1]
    q = data.get("quantization_config") if isinstance(data, dict) else None
    if not isinstance(q, dict):
        return None
    return {"compressed-tensors": "compressed-tensors", "fp8": "fp8-block",
            "mxfp4": "mxfp4-blocks"}.get(q.get("quant_method"))


def _qconfig(folder: Path) -> dict:
    from workbench.core.limits import load_sidecar_json
    return load_sidecar_json(folder / "config.json", "config.json")["quantization_config"]


def open_fp8_block(path) -> Model:
    from workbench.formats.loaders.compressed_tensors_format import block_dequant
    from workbench.formats.loaders.safetensors_format import open_safetensors
    p = Path(path)
    folder = p if p.is_dir() else p.parent
    q = _qconfig(folder)
    bs = q.get("weight_block_size", [128, 128])
    if not (isinstance(bs, list) and len(bs) == 2 and all(
            isinstance(b, int) and not isinstance(b, bool) and 0 < b <= 1 << 20 for b in bs)):
        raise WorkbenchError(f"quantization_config weight_block_size {str(bs)[:40]} is not two "
                             "positive integers", path=str(folder / "config.json"))
    if q.get("fmt", "e4m3") != "e4m3":
        raise WorkbenchError(f"FP8 fmt {str(q.get('fmt'))[:20]} is not supported (e4m3)",
                             path=str(folder / "config.json"))
    base = open_safetensors(p)
    infos: dict[str, TensorInfo] = {}
    parts: dict[str, str] = {}
    for name, info in base.tensors.items():
        if name.endswith(".weight_scale_inv"):
            w = name[:-len("_scale_inv")]
            if w not in base.tensors:
                raise WorkbenchError("weight_scale_inv without its weight",
                                     path=info.file or str(p), tensor=name)
            continue
        sname = f"{name}_scale_inv"
        if sname not in base.tensors:
            if info.dtype.startswith("F8"):    # read unscaled it would be silently wrong
                raise WorkbenchError(f"{info.dtype} weight without its weight_scale_inv",
                                     path=info.file or str(p), tensor=name)
            infos[name] = info
            continue
        if info.dtype != "F8_E4M3" or len(info.shape) != 2:
            raise WorkbenchError(f"a weight with weight_scale_inv must be 2-D float8_e4m3fn, "
                                 f"got {info.dtype} {tuple(info.shape)}", path=info.file or str(p),
                                 tensor=name)
        rows, cols = info.shape
        want = (-(-rows // bs[0]), -(-cols // bs[1]))
        sinfo = base.info(sname)
        if tuple(sinfo.shape) != want or sinfo.dtype not in ("F32", "BF16", "F16"):
            raise WorkbenchError(f"weight_scale_inv {sinfo.dtype} {tuple(sinfo.shape)} does not "
                                 f"fit {bs[0]}x{bs[1]} blocks of a {rows}x{cols} weight "
                                 f"(expected {want})", path=sinfo.file or str(p), tensor=sname)
        infos[name] = TensorInfo(name, tuple(info.shape), "F32", info.nbytes + sinfo.nbytes,
                                 info.file, quant=f"fp8-e4m3-b{bs[0]}x{bs[1]}")
        parts[name] = sname

    def raw(name: str) -> np.ndarray:
        s = parts.get(name)
        if s is None:
            return base.raw(name)
        rows, cols = infos[name].shape
        w = base.read_matrix(name).reshape(rows, cols)
        return block_dequant(w, np.asarray(base.read(s), np.float32), bs)

    return Model(str(p), "fp8-block", infos, raw, dict(base.metadata))


def mxfp4_dequant(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 weights of gpt-oss MXFP4 blocks [*prefix, G, 16] and scales [*prefix, G], in
    transformers' layout (3-D: the last two axes transposed)."""
    *prefix, g, b = blocks.shape
    out = np.empty((*prefix, g, 2 * b), np.float32)
    out[..., 0::2] = _FP4[blocks & 15]
    out[..., 1::2] = _FP4[blocks >> 4]
    e = scales.astype(np.int32)[..., None] - 127
    with np.errstate(over="ignore"):
        out = np.ldexp(out, e).astype(np.float32).reshape(*prefix, g * 2 * b)
    if out.ndim == 3:
        out = np.ascontiguousarray(out.transpose(0, 2, 1))
    return out


def open_mxfp4_blocks(path) -> Model:
    from workbench.formats.loaders.safetensors_format import open_safetensors
    p = Path(path)
    base = open_safetensors(p)
    infos: dict[str, TensorInfo] = {}
    parts: dict[str, tuple[str, str]] = {}
    for name, info in base.tensors.items():
        if name.endswith("_scales"):
            if name[:-len("_scales")] + "_blocks" not in base.tensors:
                raise WorkbenchError("MXFP4 _scales without its _blocks",
                                     path=info.file or str(p), tensor=name)
            continue
        if not name.endswith("_blocks"):
            infos[name] = info
            continue
        stem = name[:-len("_blocks")]
        sname = f"{stem}_scales"
        if sname not in base.tensors:
            raise WorkbenchError("MXFP4 _blocks without its _scales", path=info.file or str(p),
                                 tensor=name)
        sinfo = base.info(sname)
        shape = tuple(int(v) for v in info.shape)
        if info.dtype != "U8" or sinfo.dtype != "U8" or len(shape) < 2 or shape[-1] != 16 \
                or tuple(sinfo.shape) != shape[:-1] or len(shape) > 4:
            raise WorkbenchError(f"MXFP4 blocks {info.dtype} {shape} / scales {sinfo.dtype} "
                                 f"{tuple(sinfo.shape)}: expected uint8 [..., G, 16] and uint8 "
                                 "[..., G]", path=info.file or str(p), tensor=name)
        full = (*shape[:-2], shape[-2] * 32)
        if len(full) == 3:
            full = (full[0], full[2], full[1])
        infos[stem] = TensorInfo(stem, full, "F32", info.nbytes + sinfo.nbytes, info.file,
                                 quant="mxfp4-g32")
        parts[stem] = (name, sname)

    def raw(name: str) -> np.ndarray:
        part = parts.get(name)
        if part is None:
            return base.raw(name)
        bi, si = base.info(part[0]), base.info(part[1])
        blocks = np.asarray(base.raw(part[0])).view(np.uint8).reshape(tuple(bi.shape))
        scales = np.asarray(base.raw(part[1])).view(np.uint8).reshape(tuple(si.shape))
        # a 3-D (experts) result as its (experts * rows, cols) matrix, as every loader's raw
        return mxfp4_dequant(blocks, scales).reshape(infos[name].matrix_shape)

    return Model(str(p), "mxfp4-blocks", infos, raw, dict(base.metadata))
