"""Quantized safetensors: packed codes + scales per tensor, the scheme of each in metadata.

Layout: a tensor `W` quantized with scheme S is stored as one safetensors tensor per storage
array, named ``W::codes``, ``W::scales`` (and ``W::zeros`` ...), with exactly the bytes of
``QuantizedTensor.arrays``. Kept tensors are stored unchanged under their own name.
The header metadata key ``quant_workbench`` holds JSON::

    {"version": 1, "plan": {...plan JSON...},
     "tensors": {"W": {"scheme": "int4-g128", "shape": [4096, 4096], "dtype": "F32",
                       "arrays": ["codes", "scales"]}, ...}}

`open_model` recognises such a file (workbench.formats.loaders.quantized_format) and presents
the original tensors, dequantized on demand with the registry's reference dequantize: exactly the
reference result.
"""

from __future__ import annotations

import json

import numpy as np

from workbench.formats.dtypes import STORAGE
from workbench.quant.evaluate import quantize
from workbench.quant import streaming
from workbench.quant.plan import KEEP
from workbench.core.progress import Progress
from workbench.export import register_exporter
from workbench.export.st_writer import StreamingSafetensorsWriter

from workbench.formats.loaders.quantized_format import META_KEY, SEP

KEPT_STREAM_BYTES = 64 << 20   # a kept tensor above this is written in row slices of:
KEPT_CHUNK_BYTES = 16 << 20


@register_exporter("safetensors", ".safetensors",
                   "quantized weights: packed codes + scales, scheme per tensor in metadata")
def export_quantized_safetensors(model, plan, out_path, strict: bool = False):
    from workbench.quant.runtimes import check_strict, plan_decisions, summarize
    decisions = plan_decisions(model, plan, "any")
    if strict:
        check_strict(decisions.values(), path=model.path)
    names = list(model.tensors)
    total = sum(max(model.info(n).numel, 1) for n in names) or 1
    done = 0
    index = {}
    writer = StreamingSafetensorsWriter(out_path)
    try:
        for k, n in enumerate(names, 1):
            info = model.info(n)
            yield Progress(done, total, f"exporting {k}/{len(names)} {n}")
            scheme = decisions[n].applied
            if scheme == KEEP:
                raw = model.raw(n)
                if info.quant or info.dtype not in STORAGE:
                    # a GGUF block type or an already-quantized tensor: store its float32 decoding
                    writer.add(n, model.read(n).astype(np.float32))
                elif info.nbytes > KEPT_STREAM_BYTES and info.rows >= 2:
                    # a large tensor: its rows read and written a slice at a time (the loader
                    # reads the rows asked for), the same bytes
                    step = max(1, KEPT_CHUNK_BYTES // max(1, info.nbytes // info.rows))
                    writer.add_stream(n, (np.asarray(raw[r0:r0 + step]).reshape(-1)
                                          for r0 in range(0, info.rows, step)),
                                      dtype=info.dtype, shape=info.shape)
                else:
                    writer.add(n, np.asarray(raw).reshape(info.shape), dtype=info.dtype)
            elif streaming.export_streamed(model, info, scheme):
                # a big tensor: quantized and written a block of rows at a time, the same bytes
                key, blocks, spool = streaming.quantized_row_blocks(model, n, scheme)
                writer.add_stream(f"{n}{SEP}{key}", blocks)
                for k, parts in spool.items():
                    writer.add(f"{n}{SEP}{k}", np.concatenate(parts))
                index[n] = {"scheme": scheme, "shape": list(info.shape), "dtype": info.dtype,
                            "arrays": [key, *spool]}
            else:
                w = model.read_matrix(n)
                qt = model.quantize_tensor(n, w, scheme) if hasattr(
                    model, "quantize_tensor") else quantize(w, scheme, tensor=n)
                for key, arr in qt.arrays.items():
                    writer.add(f"{n}{SEP}{key}", arr)
                index[n] = {"scheme": scheme, "shape": list(info.shape), "dtype": info.dtype,
                            "arrays": list(qt.arrays)}
            done += max(info.numel, 1)
        writer.metadata[META_KEY] = json.dumps({"version": 1, "plan": plan.to_dict(),
                                                "tensors": index})
        yield Progress(total, total, "writing file")
        writer.finish()
    except BaseException:
        writer.abort()
        raise
    summary = summarize(decisions.values())
    return {"path": str(out_path), "format": "safetensors", "quantized": len(index),
            "tensors": len(names), "fallbacks": summary.to_dict(),
            "notes": {d.name: d.note for d in decisions.values()
                      if d.note and d.kind in ("fallback", "skipped")}}
