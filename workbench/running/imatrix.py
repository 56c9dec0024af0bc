"""Activation statistics (llama.cpp's importance matrix): per 2-D weight read by a Linear, the
sum over calibration tokens of x_j^2 per input column, collected with forward hooks in one pass.

GGUF form (as llama.cpp's tools/imatrix writes it): general.type = "imatrix", imatrix.datasets,
imatrix.chunk_count, imatrix.chunk_size; tensors `<name>.in_sum2` and `<name>.counts` (F32),
names mapped to llama.cpp names as the tensor-type exporter maps them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress


def collect(model, calib=None, samples: int | None = None, max_len: int = 128):
    """Job: {workbench name: (in_sum2 float64[in], count tokens)} over the calibration inputs,
    run block by block (workbench.running.runner_jobs.input_pass: an expert's statistics come from the
    tokens routed to it)."""
    from workbench.running.runner_jobs import input_pass
    stats: dict[str, list] = {}

    def observe(name, x):
        s = stats.setdefault(name, [np.zeros(x.shape[-1]), 0])
        s[0] += (x.double() ** 2).sum(0).cpu().numpy()
        s[1] += int(x.shape[0])

    data = yield from input_pass(model, calib, samples, max_len, observe=observe,
                                 label="collecting activations")
    return {n: (v[0], v[1]) for n, v in stats.items()}, len(data), max(len(s) for s in data)


def write_imatrix_gguf(model, stats: dict, path, dataset: str, chunk_count: int, chunk_size: int):
    """Write the imatrix GGUF atomically (a temporary file beside `path`, fsync, rename): a
    full disk or a folder that cannot be written is one WorkbenchError naming `path`, and an
    existing file is left as it was."""
    import gguf
    import os
    from workbench.core.atomic import default_file_mode, make_temp, write_problem
    from workbench.core.errors import WorkbenchError
    from workbench.formats.llama_names import detect_family, llama_cpp_name
    family = detect_family(model)
    fd, tmp = make_temp(Path(path))
    os.close(fd)
    try:
        w = gguf.GGUFWriter(tmp, arch="")
        w.add_type("imatrix")
        w.add_array("imatrix.datasets", [dataset])
        w.add_uint32("imatrix.chunk_count", int(chunk_count))
        w.add_uint32("imatrix.chunk_size", int(chunk_size))
        for g, (s2, cnt) in _llama_entries(model, stats, family, llama_cpp_name).items():
            w.add_tensor(f"{g}.in_sum2", s2)
            w.add_tensor(f"{g}.counts", cnt)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    except OSError as exc:
        raise WorkbenchError(f"write failed ({write_problem(exc) or exc.strerror or exc}); "
                             "existing file left unchanged", path=str(path)) from exc
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _llama_entries(model, stats: dict, family, llama_cpp_name) -> dict:
    """{llama.cpp tensor name: (in_sum2 float32 (n_mat, cols), counts float32 (n_mat, 1))}.
    A mixture of experts' per-expert tensors share one merged llama.cpp tensor
    (blk.N.ffn_up_exps): one row per expert, in expert order, as llama-imatrix writes it (an
    expert no calibration token reached: zero sums, count 0)."""
    from workbench.formats.catalog import expert_index
    by_g: dict[str, list[str]] = {}
    for n in model.tensors:
        if n in stats:
            g = llama_cpp_name(n, family)
            if g is not None:
                by_g.setdefault(g, []).append(n)
    out = {}
    for g, names in by_g.items():
        if len(names) == 1:
            s2, cnt = stats[names[0]]
            out[g] = (np.asarray(s2, dtype=np.float32).reshape(1, -1),
                      np.asarray([cnt], dtype=np.float32).reshape(1, 1))
            continue
        idx = [expert_index(n) for n in names]
        if None in idx:
            raise WorkbenchError(f"tensors {names[0]} and {names[1]} are both llama.cpp's {g}",
                                 path=str(model.path))
        n_mat = max(idx) + 1
        cols = len(stats[names[0]][0])
        s2 = np.zeros((n_mat, cols), np.float32)
        cnt = np.zeros((n_mat, 1), np.float32)
        for i, n in zip(idx, names):
            s2[i] = np.asarray(stats[n][0], dtype=np.float32).reshape(-1)
            cnt[i, 0] = stats[n][1]
        out[g] = (s2, cnt)
    return out


MAX_IMATRIX_ENTRIES = 1 << 20     # tensors in one imatrix (llama.cpp writes one per weight)
MAX_IMATRIX_NAME = 4096           # bytes of a tensor name in a legacy .dat
MAX_IMATRIX_VALUES = 1 << 26      # values of one entry (256 experts x 16,384 columns = 2^22)


def read_imatrix(path) -> dict[str, np.ndarray]:
    """{llama.cpp tensor name: E[x_j^2]} from an imatrix GGUF or legacy .dat.

    Read with the model readers' bounds: every count and length is checked against the bytes
    the file holds before anything is allocated or read (a .dat is read entry by entry, never
    whole), values must be finite and non-negative, and every problem is a one-line
    WorkbenchError naming the imatrix file (and tensor)."""
    from workbench.core.limits import check_regular_file
    p = str(path)
    check_regular_file(p, "imatrix file")
    try:
        with open(p, "rb") as f:
            if f.read(4) != b"GGUF":
                f.seek(0)
                return _read_imatrix_dat(p, f)
    except OSError as exc:
        raise WorkbenchError(f"cannot read imatrix file ({exc.strerror})", path=p) from None
    return _read_imatrix_gguf(p)


def _read_imatrix_gguf(p: str) -> dict[str, np.ndarray]:
    import struct
    from workbench.core.limits import prescan_gguf
    from workbench.formats.loaders.gguf_reader import GGUFFile
    try:
        prescan_gguf(p)
        r = GGUFFile(p)
    except WorkbenchError as exc:
        raise exc.with_context(p) from None
    except (ValueError, IndexError, KeyError, OSError, struct.error, TypeError,
            OverflowError) as exc:
        raise WorkbenchError(f"corrupt imatrix GGUF ({type(exc).__name__})", path=p) from None
    try:
        kind = r.fields.get("general.type")
        if kind is not None and kind.contents() != "imatrix":
            raise WorkbenchError(f"not an imatrix GGUF (general.type is "
                                 f"{str(kind.contents())[:40]!r}; a model?)", path=p)
        t = {}
        for x in r.tensors:
            if x.name.endswith((".in_sum2", ".counts")):
                if x.tensor_type.name != "F32":
                    raise WorkbenchError(f"imatrix tensor is {x.tensor_type.name}, expected F32",
                                         path=p, tensor=x.name)
                if x.n_elements > MAX_IMATRIX_VALUES:
                    raise WorkbenchError(f"imatrix tensor of {x.n_elements:,} values (at most "
                                         f"{MAX_IMATRIX_VALUES:,})", path=p, tensor=x.name)
                t[x.name] = np.array(x.data, dtype=np.float64).reshape(-1)
        out = {}
        for k, v in t.items():
            if not k.endswith(".in_sum2"):
                continue
            n = k[:-len(".in_sum2")]
            c = t.get(n + ".counts")
            if c is None or c.size == 0:
                c = np.ones(1)   # sums without counts: taken as already averaged
            if c.size > 1 and v.size % c.size:
                raise WorkbenchError(f"{c.size} counts do not divide {v.size} sums", path=p,
                                     tensor=k)
            if not (np.isfinite(c).all() and np.isfinite(v).all()) or (c < 0).any() \
                    or (v < 0).any():
                raise WorkbenchError("imatrix holds negative or non-finite values", path=p,
                                     tensor=k)
            cnt = np.maximum(c, 1.0)
            out[n] = (v.reshape(c.size, -1) / cnt[:, None]).reshape(-1) if c.size > 1 \
                else v / cnt[0]
        if not out:
            raise WorkbenchError("imatrix GGUF has no <name>.in_sum2 tensors", path=p)
        return out
    finally:
        r.close()


def _read_imatrix_dat(p: str, f) -> dict[str, np.ndarray]:
    """llama.cpp's legacy format: i32 count, then per entry i32 name length, name, i32 ncall,
    i32 nval, f32[nval] (a trailing dataset name after the entries is ignored). Read from the
    open file `f` field by field: each count is checked against the bytes left before its
    values are read, so a header claiming the world allocates nothing."""
    import os
    size = os.fstat(f.fileno()).st_size

    def read(n: int, what: str) -> bytes:
        at = f.tell()
        b = f.read(n)
        if len(b) != n:
            raise WorkbenchError(f"imatrix .dat truncated (reading {what} at byte {at:,})",
                                 path=p)
        return b

    def i32(what: str) -> int:
        return int.from_bytes(read(4, what), "little", signed=True)

    if size < 4:
        raise WorkbenchError("not an imatrix GGUF or .dat file (too short)", path=p)
    n_entries = i32("the entry count")
    # each entry takes at least 12 bytes (3 i32) plus a one-byte name
    if n_entries <= 0 or n_entries > MAX_IMATRIX_ENTRIES or n_entries * 13 > size - 4:
        raise WorkbenchError(f"not an imatrix GGUF or .dat file (claims {n_entries:,} entries "
                             f"in {size:,} bytes)", path=p)
    out = {}
    for _ in range(n_entries):
        ln = i32("a name length")
        off = f.tell()
        if ln <= 0 or ln > MAX_IMATRIX_NAME or off + ln > size:
            raise WorkbenchError(f"imatrix .dat entry name of {ln:,} bytes at byte {off - 4:,} "
                                 "(corrupt or truncated)", path=p)
        try:
            name = read(ln, "a name").decode("utf-8")
        except UnicodeDecodeError:
            raise WorkbenchError(f"imatrix .dat entry name at byte {off:,} is not UTF-8",
                                 path=p) from None
        ncall = i32("ncall")
        nval = i32("nval")
        left = size - f.tell()
        if ncall < 0 or nval <= 0 or nval > left // 4 or nval > MAX_IMATRIX_VALUES:
            raise WorkbenchError(f"entry claims ncall {ncall:,} and {nval:,} values with "
                                 f"{left:,} bytes left (at most {MAX_IMATRIX_VALUES:,} values "
                                 "an entry)", path=p, tensor=name)
        if name in out:
            raise WorkbenchError("entry appears twice", path=p, tensor=name)
        vals = np.frombuffer(read(4 * nval, "values"), "<f4").astype(np.float64)
        if not np.isfinite(vals).all() or (vals < 0).any():
            raise WorkbenchError("imatrix holds negative or non-finite values", path=p,
                                 tensor=name)
        out[name] = vals / max(ncall, 1)
    return out


def check_imatrix_for(model, imatrix_path, name: str, values: np.ndarray) -> None:
    """The imatrix vector for the model's tensor `name` must have one value per input column;
    a WorkbenchError naming the imatrix file and the tensor otherwise."""
    info = model.info(name)
    if info.ndim == 2 and values.size != info.cols:
        raise WorkbenchError(f"imatrix has {values.size:,} values for a tensor of "
                             f"{info.cols:,} input columns (an imatrix of another model?)",
                             path=str(imatrix_path), tensor=name)
    if info.ndim > 2 and (values.size == 0 or values.size % info.shape[-1]):
        raise WorkbenchError(f"imatrix has {values.size:,} values for a tensor of "
                             f"{info.shape[-1]:,} input columns (an imatrix of another "
                             "model?)", path=str(imatrix_path), tensor=name)


#: roles of the 2-D weights whose input an imatrix describes (llama-imatrix's matrix
#: multiplications); embeddings, norms, biases and buffers never have importance
_NO_IMPORTANCE = ("embedding", "norm", "bias", "other")


def _few(names, k: int = 3) -> str:
    names = list(names)
    return ", ".join(names[:k]) + (f", ... ({len(names):,} in all)" if len(names) > k else "")


def imatrix_for_model(model, imatrix) -> tuple[dict[str, np.ndarray], list[str]]:
    """({workbench name: E[x^2]} of the model's tensors the imatrix file names, [the model's
    weight matrices it has no entry for]). An imatrix naming none of the model's tensors is a
    WorkbenchError naming the file, a few of its entries and a few of the names it would need
    (it is another model's, or of a tool naming tensors otherwise); a vector of the wrong length
    is one too (check_imatrix_for)."""
    from workbench.formats.catalog import expert_index
    from workbench.formats.llama_names import detect_family, llama_cpp_name
    im = read_imatrix(imatrix)
    fam = detect_family(model)
    out, missing, wanted = {}, [], []
    for n in model.tensors:
        g = llama_cpp_name(n, fam)
        info = model.info(n)
        if g not in im:
            if g is not None and info.ndim >= 2 and info.role not in _NO_IMPORTANCE:
                missing.append(n)
                wanted.append(g)
            continue
        v = im[g]
        e = expert_index(n)
        if e is not None and info.ndim == 2 and v.size > info.cols and v.size % info.cols == 0:
            # a merged llama.cpp expert tensor (blk.N.ffn_up_exps): one row per expert
            if e >= v.size // info.cols:
                raise WorkbenchError(f"imatrix has {v.size // info.cols} experts for "
                                     f"{g}, not expert {e}", path=str(imatrix), tensor=n)
            v = v[e * info.cols:(e + 1) * info.cols]
        check_imatrix_for(model, imatrix, n, v)
        out[n] = v
    if not out:
        need = f"the model's would be {_few(dict.fromkeys(wanted))}" if wanted else \
            "the model has no weight matrix llama.cpp names"
        raise WorkbenchError(f"the imatrix names none of the model's tensors: its {len(im):,} "
                             f"entries are {_few(sorted(im))}; {need} (an imatrix of another "
                             "model?)", path=str(imatrix))
    return out, missing


def missing_note(imatrix, missing: list[str], matched: int) -> str:
    """The one-line warning for the weight matrices an imatrix has no entry for."""
    return (f"warning: the imatrix {imatrix} has no entry for {len(missing):,} weight "
            f"matrices of the model ({matched:,} tensors matched), which get no importance "
            f"(rtn, or the mean second moment in the activation measure): {_few(missing)}")


def second_moments(model, calib=None, imatrix=None, samples=None):
    """Job: {workbench name: E[x_j^2]} from calibration inputs or an imatrix file (one naming
    none of the model's tensors is refused: imatrix_for_model)."""
    if imatrix:
        out, _missing = imatrix_for_model(model, imatrix)
        yield Progress(1, 1, "imatrix read")
        return out
    stats, _, _ = yield from collect(model, calib, samples)
    return {n: s2 / max(c, 1) for n, (s2, c) in stats.items()}
