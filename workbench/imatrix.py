"""Activation statistics (llama.cpp's importance matrix): per 2-D weight read by a Linear, the
sum over calibration tokens of x_j^2 per input column, collected with forward hooks in one pass.

GGUF form (as llama.cpp's tools/imatrix writes it): general.type = "imatrix", imatrix.datasets,
imatrix.chunk_count, imatrix.chunk_size; tensors `<name>.in_sum2` and `<name>.counts` (F32),
names mapped to llama.cpp names as the tensor-type exporter maps them."""

from __future__ import annotations

import numpy as np

from .errors import WorkbenchError


def collect(model, calib=None, samples: int | None = None, max_len: int = 128):
    """Job: {workbench name: (in_sum2 float64[in], count tokens)} over the calibration inputs,
    run block by block (workbench.runner.input_pass: an expert's statistics come from the
    tokens routed to it)."""
    from .runner import input_pass
    stats: dict[str, list] = {}

    def observe(name, x):
        s = stats.setdefault(name, [np.zeros(x.shape[-1]), 0])
        s[0] += (x.double() ** 2).sum(0).cpu().numpy()
        s[1] += int(x.shape[0])

    data = yield from input_pass(model, calib, samples, max_len, observe=observe,
                                 label="collecting activations")
    return {n: (v[0], v[1]) for n, v in stats.items()}, len(data), max(len(s) for s in data)


def write_imatrix_gguf(model, stats: dict, path, dataset: str, chunk_count: int, chunk_size: int):
    import gguf
    import os
    from .export.llama_tensor_types import detect_family, llama_cpp_name
    family = detect_family(model)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        w = gguf.GGUFWriter(tmp, arch="")
        w.add_type("imatrix")
        w.add_array("imatrix.datasets", [dataset])
        w.add_uint32("imatrix.chunk_count", int(chunk_count))
        w.add_uint32("imatrix.chunk_size", int(chunk_size))
        for n, (s2, cnt) in stats.items():
            g = llama_cpp_name(n, family)
            if g is None:
                continue
            w.add_tensor(f"{g}.in_sum2",
                         np.asarray(s2, dtype=np.float32).reshape(1, -1))
            w.add_tensor(f"{g}.counts", np.asarray([cnt], dtype=np.float32).reshape(1, 1))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def read_imatrix(path) -> dict[str, np.ndarray]:
    """{llama.cpp tensor name: E[x_j^2]} from an imatrix GGUF or legacy .dat."""
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        import gguf
        r = gguf.GGUFReader(str(path))
        t = {x.name: np.asarray(x.data, dtype=np.float64).reshape(-1) for x in r.tensors}
        out = {}
        for k, v in t.items():
            if k.endswith(".in_sum2"):
                n = k[:-len(".in_sum2")]
                c = t.get(n + ".counts")
                cnt = float(c[0]) if c is not None and c.size else 1.0
                out[n] = v / max(cnt, 1.0)
        return out
    data = open(path, "rb").read()
    try:
        off = 0
        (n_entries,) = np.frombuffer(data, "<i4", 1, off); off += 4
        out = {}
        for _ in range(int(n_entries)):
            (ln,) = np.frombuffer(data, "<i4", 1, off); off += 4
            name = data[off:off + int(ln)].decode(); off += int(ln)
            ncall, nval = np.frombuffer(data, "<i4", 2, off); off += 8
            vals = np.frombuffer(data, "<f4", int(nval), off).astype(np.float64); off += 4 * int(nval)
            out[name] = vals / max(int(ncall), 1)
        return out
    except (ValueError, UnicodeDecodeError) as exc:
        raise WorkbenchError(f"not an imatrix GGUF or .dat file ({exc})", path=str(path)) from None
