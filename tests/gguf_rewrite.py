"""Rewrite a GGUF with gguf's own reader and writer: tensors dropped or added, keys set.

``rewrite_gguf(src, dst, drop=..., add={name: float32 array}, kv={key: value})``: every other
key/value and tensor of `src` is copied as stored (quantized tensors byte for byte). A value in
`kv` that is a list of ints is written as an INT32 array, an int as UINT32, a float as FLOAT32,
a str as a string; None removes the key.
"""

from __future__ import annotations

import numpy as np


def _value_type(v):
    import gguf
    T = gguf.GGUFValueType
    if isinstance(v, bool):
        return T.BOOL, None
    if isinstance(v, int):
        return T.UINT32, None
    if isinstance(v, float):
        return T.FLOAT32, None
    if isinstance(v, str):
        return T.STRING, None
    if isinstance(v, list):
        sub = T.STRING if v and isinstance(v[0], str) else (
            T.FLOAT32 if v and isinstance(v[0], float) else T.INT32)
        return T.ARRAY, sub
    raise TypeError(type(v))


def rewrite_gguf(src, dst, drop=(), add=None, kv=None) -> None:
    import gguf
    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch)
    kv = dict(kv or {})
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key in kv:
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(f.types) > 1 else None
        w.add_key_value(key, f.contents(), vtype, sub_type=sub)
    for key, v in kv.items():
        if v is not None:
            vt, sub = _value_type(v)
            w.add_key_value(key, v, vt, sub_type=sub)
    for t in r.tensors:
        if t.name in drop:
            continue
        if t.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            w.add_tensor(t.name, np.array(t.data).reshape(tuple(int(s) for s in
                                                                reversed(t.shape))))
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)   # byte rows
    for name, arr in (add or {}).items():
        w.add_tensor(name, np.ascontiguousarray(arr, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
