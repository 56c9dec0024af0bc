"""The float dtype of a model's MLX export, and the MLX schemes as that export applies them.

mlx_lm.convert casts a model to config.json's ``torch_dtype`` (float16, bfloat16 or float32) and
quantizes in it: the affine scales and biases take that dtype. The workbench does the same
(float16 scales for a float32 model: workbench.schemes.mlx), so the ``mlx`` runtime's decisions
name the dtype's scheme (``mlx-q4-g64@bf16`` for a bfloat16 model): evaluate, the KL checks and
the export then quantize the same bytes. Sizes do not depend on it.
"""

from __future__ import annotations

from collections import Counter

DTYPE_OF_CONFIG = {"float16": "F16", "bfloat16": "BF16", "float32": "F32"}
FLOAT_DTYPES = ("F16", "BF16", "F32")


def export_dtype(model, config: dict | None = None) -> str:
    """"F16", "BF16" or "F32": config.json's torch_dtype (or dtype; a text_config's) when it is
    one of those, else the dtype most of the model's 2-D float weights have."""
    if config is None:
        from workbench.formats.llama_names import read_config
        config = read_config(model)
    for holder in (config or {}, (config or {}).get("text_config") or {}):
        for key in ("torch_dtype", "dtype"):
            v = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(v, str) and v in DTYPE_OF_CONFIG:
                return DTYPE_OF_CONFIG[v]
    counts = Counter(model.info(n).dtype for n in model.tensors
                     if model.info(n).ndim == 2 and model.info(n).dtype in FLOAT_DTYPES)
    return counts.most_common(1)[0][0] if counts else "F32"


def with_export_dtype(model, decisions: dict) -> dict:
    """`decisions` with every applied MLX scheme replaced by its export-dtype scheme."""
    from dataclasses import replace

    from workbench.quant.plan import KEEP
    from workbench.schemes import get_scheme
    dtype = export_dtype(model)
    if dtype == "F32":
        return decisions
    names: dict[str, str] = {}
    out = {}
    for n, d in decisions.items():
        if d.applied == KEEP:
            out[n] = d
            continue
        name = names.get(d.applied)
        if name is None:
            name = names[d.applied] = get_scheme(d.applied).for_dtype(dtype).name
        out[n] = replace(d, applied=name)
    return out
