"""Activation statistics (llama.cpp's importance matrix): per 2-D weight read by a Linear, the
sum over calibration tokens of x_j^2 per input column, collected with forward hooks in one pass.

GGUF form (as llama.cpp's tools/imatrix writes it): general.type = "imatrix", imatrix.datasets,
imatrix.chunk_count, imatrix.chunk_size; tensors `<name>.in_sum2` and `<name>.counts` (F32),
names mapped to llama.cpp names as the tensor-type exporter maps them."""

from __future__ import annotations

import numpy as np

from .errors import WorkbenchError
from .progress import Progress


def collect(model, calib=None, samples: int | None = None, max_len: int = 128):
    """Job: {workbench name: (in_sum2 float64[in], count tokens)} over the calibration inputs."""
    from .calibration import batches, calibration_samples
    from .progress import subjob
    from .runner import get_runner
    runner = get_runner(model)
    runner.restore()
    data = yield from subjob(calibration_samples(model, calib, samples, max_len), 0, 5, 100)
    stats: dict[str, list] = {}
    handles = []
    mask_box = {}

    def hook_for(name):
        def hook(mod, inputs):
            x = inputs[0].detach().float()
            m = mask_box["mask"]
            x = x.reshape(-1, x.shape[-1])
            keep = m.reshape(-1) > 0
            if keep.shape[0] == x.shape[0]:
                x = x[keep]
            s = stats.setdefault(name, [np.zeros(x.shape[-1]), 0])
            s[0] += (x.double() ** 2).sum(0).numpy()
            s[1] += int(x.shape[0])
        return hook

    for n in runner.linear_names():
        handles.append(runner.module_for[n].register_forward_pre_hook(hook_for(n)))
    try:
        done = 0
        import torch
        for ids, mask in batches(data, 16):
            yield Progress(5 + 95 * done / len(data), 100, "collecting activations")
            mask_box["mask"] = torch.from_numpy(mask)
            runner.forward((ids, mask))
            done += ids.shape[0]
    finally:
        for h in handles:
            h.remove()
    yield Progress(100, 100, "done")
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
