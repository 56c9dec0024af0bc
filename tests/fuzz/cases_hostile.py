"""Generators for the hardening classes of issue 20, one input kind each. Each returns
(file name, bytes); kinds whose case is a scenario rather than one file (outputs, truncation,
optional, roundtrip) return a JSON spec that tests/fuzz/hostile.py carries out.

    outputs      1  an output argument naming an input (same path, symlink, hard link, folder)
    pt-cycles    2  PyTorch checkpoints whose dicts contain themselves / fan out
    imatrix      3  imatrix GGUF and legacy .dat files, valid then damaged
    calibration  4  .npy / text / JSONL / safetensors calibration inputs, hostile
    roundtrip    5  the tool's own exports at their edges, opened again by every loader
    gguf-align   6  GGUF tensor data offsets that break the alignment
    truncation   7  the input truncated before / while an export reads it
    scale        8  large headers and plans (tens of thousands of tensors / rules)
    optional     9  a missing optional dependency for the command that needs it
"""

from __future__ import annotations

import io
import json
import random
import struct

import numpy as np

HUGE32 = [0, 1, -1, 2**31 - 1, -2**31, 2**20, 255, 4096]


# ---- 1 outputs ----------------------------------------------------------------------------
def outputs(r: random.Random):
    cmd = r.choice(["export-plan", "export-safetensors", "export-gguf", "export-types",
                    "export-imatrix", "allocate", "export-acts"])
    target = r.choice(["model", "plan", "config", "imatrix", "calib", "folder"])
    link = r.choice(["same", "symlink", "hardlink", "relative", "none"])
    if target == "folder":
        link = r.choice(["same", "symlink", "none"])
    return "case.json", json.dumps({"cmd": cmd, "target": target, "link": link}).encode()


# ---- 2 pt-cycles --------------------------------------------------------------------------
def pt_cycles(r: random.Random):
    import torch
    t = torch.ones(2, 4)
    m = r.randint(0, 5)
    if m == 0:                                    # a dict that contains itself
        d = {"w": t}
        d[r.choice(["state_dict", "model", "x", "module"])] = d
    elif m == 1:                                  # through a nested dict
        d = {"w": t, "a": {}}
        d["a"][r.choice(["b", "state_dict"])] = d
    elif m == 2:                                  # two dicts pointing at each other
        a, b = {"w": t}, {"v": t}
        a["b"], b["a"] = b, a
        d = {r.choice(["state_dict", "model", "top"]): a}
    elif m == 3:                                  # a shared dict fanned out 2^depth times
        d = {"t": t}
        for _ in range(r.randint(8, 40)):
            d = {"a": d, "b": d}
    elif m == 4:                                  # wrapper chain looping back
        inner = {"w": t}
        outer = {"state_dict": {"model": inner}}
        inner["module"] = outer
        d = outer
    else:                                         # a plain one (must load)
        d = {"state_dict": {"w": t, "n": {"b": torch.zeros(3)}}}
    buf = io.BytesIO()
    torch.save(d, buf)
    return "m.pt", buf.getvalue()


# ---- 3 imatrix ----------------------------------------------------------------------------
NAMES = ["blk.0.attn_q.weight", "blk.0.ffn_up.weight", "blk.1.ffn_down.weight"]


def _dat(entries, tail=b"") -> bytes:
    out = struct.pack("<i", len(entries))
    for name, ncall, vals in entries:
        nb = name.encode()
        out += struct.pack("<i", len(nb)) + nb + struct.pack("<ii", ncall, len(vals))
        out += np.asarray(vals, "<f4").tobytes()
    return out + tail


def _imatrix_gguf(r: random.Random, entries) -> bytes:
    import os
    import tempfile

    import gguf
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(path, arch="")
        w.add_type(r.choice(["imatrix", "imatrix", "model"]))
        w.add_array("imatrix.datasets", ["x.txt"])
        w.add_uint32("imatrix.chunk_count", 4)
        for name, ncall, vals in entries:
            dt = np.float32 if r.random() < 0.9 else np.float16
            w.add_tensor(f"{name}.in_sum2", np.asarray(vals, dt).reshape(1, -1))
            if r.random() < 0.9:
                w.add_tensor(f"{name}.counts", np.asarray([ncall], np.float32).reshape(1, 1))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as fh:
            return fh.read()
    finally:
        os.unlink(path)


def imatrix(r: random.Random):
    entries = [(n, r.choice([1, 4, 0, 7]), np.abs(np.random.default_rng(r.randint(0, 99))
                                                  .standard_normal(r.choice([32, 32, 64, 8])))
                .astype(np.float32)) for n in NAMES[:r.randint(1, 3)]]
    if r.random() < 0.1:
        entries[0][2][0] = r.choice([np.nan, -1.0, np.inf])
    if r.random() < 0.5:
        raw = bytearray(_imatrix_gguf(r, entries))
        name = "m.imatrix.gguf"
    else:
        raw = bytearray(_dat(entries, b"" if r.random() < 0.5 else struct.pack("<i", 3) + b"abc"))
        name = "m.imatrix.dat"
    m = r.randint(0, 5)
    if m == 0:                      # a 32-bit field replaced (counts, lengths)
        pos = r.randrange(0, min(len(raw) - 4, 200)) if len(raw) > 8 else 0
        raw[pos:pos + 4] = struct.pack("<i", r.choice(HUGE32))
    elif m == 1:
        raw = raw[: r.randint(0, len(raw))]
    elif m == 2:
        for _ in range(r.randint(1, 10)):
            raw[r.randrange(len(raw))] = r.randrange(256)
    elif m == 3 and name.endswith(".dat"):   # the entry count claims the world
        raw[0:4] = struct.pack("<i", r.choice([2**31 - 1, 10**6, -5]))
    elif m == 4 and name.endswith(".gguf"):  # a u64 of the header replaced
        pos = r.randrange(8, min(len(raw) - 8, 300))
        raw[pos:pos + 8] = struct.pack("<Q", r.choice([2**63, 2**40, 7, 0]))
    return name, bytes(raw)


# ---- 4 calibration ------------------------------------------------------------------------
def _npy_header(descr: str, shape, extra=b"") -> bytes:
    h = "{'descr': '%s', 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + extra


def calibration(r: random.Random):
    m = r.randint(0, 9)
    if m == 0:                      # a header claiming hundreds of GiB
        return "c.npy", _npy_header(r.choice(["<i8", "<i4"]),
                                    r.choice([(10**11,), (2**20, 2**20), (2**40, 1)]),
                                    b"\0" * r.choice([0, 64, 4096]))
    if m == 1:                      # ids outside the vocabulary / negative
        a = np.asarray(np.random.default_rng(r.randint(0, 99)).integers(0, 500, (3, 16)))
        a[r.randrange(3), r.randrange(16)] = r.choice([512, 10**6, -1, 2**40, 511, 0])
        buf = io.BytesIO()
        np.save(buf, a.astype(r.choice([np.int64, np.int32])))
        return "c.npy", buf.getvalue()
    if m == 2:                      # not integers / pickled objects / 3-D
        buf = io.BytesIO()
        kind = r.randint(0, 2)
        if kind == 0:
            np.save(buf, np.ones((2, 3), np.float32))
        elif kind == 1:
            np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
        else:
            np.save(buf, np.ones((2, 2, 2), np.int64))
        return "c.npy", buf.getvalue()
    if m == 3:                      # a damaged .npy
        buf = io.BytesIO()
        np.save(buf, np.arange(64, dtype=np.int64).reshape(4, 16))
        b = bytearray(buf.getvalue())
        for _ in range(r.randint(1, 6)):
            b[r.randrange(min(len(b), 128))] = r.randrange(256)
        return "c.npy", bytes(b[: r.randint(0, len(b))] if r.random() < 0.3 else b)
    if m == 4:                      # one multi-megabyte line
        line = r.choice(["a", "ab ", "\u00e9", "\u4e00"]) * r.choice([2 << 20, 1 << 20, 5000])
        return "c.txt", (line + "\nhello world\n").encode()
    if m == 5:                      # bytes that are not UTF-8 / NULs / empty
        return "c.txt", r.choice([b"\xff\xfe\x00abc\n", b"", b"\n\n  \n", b"\x00" * 100,
                                  b"ok line\n\xc3\x28\n"])
    if m == 6:                      # JSONL: deep, missing text, huge ints
        lines = [json.dumps({"text": "hello there"}),
                 r.choice(["[" * 100000 + "]" * 100000, '{"txt": "x"}', '{"text": 5}',
                           '{"text": "' + "b" * (2 << 20) + '"}', "not json", '{"text": "ok"}',
                           '{"a": ' + "9" * 5000 + "}"])]
        return "c.jsonl", "\n".join(lines).encode()
    if m == 7:                      # safetensors ids: float, huge, missing, fine
        from .cases import _st
        kind = r.randint(0, 3)
        if kind == 0:
            a = np.ones((2, 8), np.int64)
            return "c.safetensors", _st({"input_ids": {"dtype": "I64", "shape": [2, 8],
                                                       "data_offsets": [0, a.nbytes]}},
                                        a.tobytes())
        if kind == 1:
            return "c.safetensors", _st({"input_ids": {"dtype": "F32", "shape": [1, 4],
                                                       "data_offsets": [0, 16]}}, b"\0" * 16)
        if kind == 2:
            return "c.safetensors", _st({"ids": {"dtype": "I64", "shape": [1],
                                                 "data_offsets": [0, 8]}}, b"\0" * 8)
        return "c.safetensors", _st({"input_ids": {"dtype": "I64", "shape": [2**20, 2**20],
                                                   "data_offsets": [0, 2**43]}}, b"")
    if m == 8:                      # a valid text (must work)
        return "c.txt", b"the quick brown fox\njumps over the lazy dog\n"
    buf = io.BytesIO()              # a valid id file, 1-D (must work)
    np.save(buf, np.arange(300, dtype=np.int64) % 500)
    return "c.npy", buf.getvalue()


# ---- 5 roundtrip --------------------------------------------------------------------------
def roundtrip(r: random.Random):
    shapes = []
    for _ in range(r.randint(1, 4)):
        shapes.append(r.choice([[0, 32], [0, 256], [4, 0], [0], [3], [8, 32], [4, 256],
                                [2, 3, 32], [5, 33], [1, 1], [16, 64]]))
    names = [r.choice(["blk.{i}.attn_q.weight", "model.layers.{i}.mlp.up_proj.weight",
                       "w{i}", "t\u00e9{i}", "lone\\udc80{i}", "x.{i}.bias", "a" * 200 + "{i}"])
             .format(i=i) for i in range(len(shapes))]
    return "case.json", json.dumps({
        "tensors": [{"name": n, "shape": s, "dtype": r.choice(["float32", "float16",
                                                               "bfloat16"])}
                    for n, s in zip(names, shapes)],
        "scheme": r.choice(["q8_0", "q4_0", "q4_k", "q6_k", "int4-g32", "int8-channel",
                            "nf4-g64", "fp16", "keep", "int4-g32-asym"]),
        "format": r.choice(["gguf", "safetensors", "compressed-tensors", "plan",
                            "llama-tensor-types"]),
        "seed": r.randint(0, 999)}).encode()


# ---- 6 gguf-align -------------------------------------------------------------------------
def _gguf_str(s: bytes) -> bytes:
    return struct.pack("<Q", len(s)) + s


def gguf_align(r: random.Random):
    align = r.choice([32, 32, 64, 16, 8])
    kv = []
    if align != 32 or r.random() < 0.3:
        kv.append(_gguf_str(b"general.alignment") + struct.pack("<II", 4, align))
    kv.append(_gguf_str(b"general.architecture") + struct.pack("<I", 8) + _gguf_str(b"llama"))
    n = r.randint(1, 3)
    tensors, datas, off = [], [], 0
    for i in range(n):
        rows, cols = r.choice([(2, 32), (4, 8), (1, 5), (3, 16)])
        data = np.random.default_rng(i).standard_normal(rows * cols).astype(np.float32).tobytes()
        shift = 0
        if r.random() < 0.6:
            shift = r.choice([1, 2, 4, 8, 12, 16, align // 2, align - 1])
        tensors.append((f"blk.{i}.attn_q.weight".encode(), (cols, rows), off + shift))
        datas.append((off + shift, data))
        off += -(-(len(data) + shift) // align) * align
    head = b"GGUF" + struct.pack("<IQQ", 3, n, len(kv)) + b"".join(kv)
    for name, dims, o in tensors:
        head += _gguf_str(name) + struct.pack("<I", len(dims)) + struct.pack(
            f"<{len(dims)}Q", *dims) + struct.pack("<IQ", 0, o)
    head += b"\0" * ((-len(head)) % align)
    body = bytearray(off + align)
    for o, d in datas:
        body[o:o + len(d)] = d
    return "m.gguf", head + bytes(body)


# ---- 7 truncation -------------------------------------------------------------------------
def truncation(r: random.Random):
    return "case.json", json.dumps({
        "source": r.choice(["safetensors", "gguf", "pytorch"]),
        "format": r.choice(["gguf", "safetensors", "llama-tensor-types"]),
        "cut": r.choice([0.0, 0.1, 0.5, 0.9, 0.99, 1.0]),
        "when": r.choice(["before", "before", "during"]),
        # large: every tensor above the loaders' pread limit (a Region read by rows) and kept
        # tensors written in row slices, as a multi-GB tensor would be
        "large": r.random() < 0.5,
        "plan": r.choice(["q8_0", "q8_0", "keep", "q4_0"]),
        "seed": r.randint(0, 999)}).encode()


# ---- 8 scale ------------------------------------------------------------------------------
def scale(r: random.Random):
    n = r.choice([5_000, 20_000, 40_000])   # 300,000: `python -m tests.fuzz.bench_scale`
    if r.random() < 0.5:
        from .cases import _st
        header = {}
        for i in range(n):
            name = r.choice(["t{}", "model.layers.{}.mlp.up_proj.weight", "blk.{}.ffn_up.w",
                             "x" * 40 + "{}"]).format(i)
            header[name] = {"dtype": r.choice(["F32", "F16", "I8"]),
                            "shape": r.choice([[0], [0, 4], [2**20, 0], [0, 2**30]]),
                            "data_offsets": [0, 0]}
        return "m.safetensors", _st(header, b"")
    rules = []
    for i in range(n):
        k = r.randrange(4)
        if k == 0:
            rules.append({"match": f"re:layers\\.{i}\\.(mlp|self_attn)\\.", "scheme": "q4_0"})
        elif k == 1:
            rules.append({"match": f"model.layers.{i}.mlp.up_proj.weight", "scheme": "q8_0"})
        elif k == 2:
            rules.append({"match": f"re:^blk\\.{i}\\.ffn_(up|down)", "scheme": "q5_0"})
        else:
            rules.append({"match": f"re:[a-z]+{i}x", "scheme": "q4_1"})
    if r.random() < 0.3:
        rules.append({"match": r.choice(["re:(", "re:a{2000}", "re:(a)\\1"]), "scheme": "q4_0"})
    return "plan.json", json.dumps({"format": "quant-workbench-plan", "version": 1,
                                    "default": "q8_0", "rules": rules}).encode()


# ---- 9 optional ---------------------------------------------------------------------------
def optional(r: random.Random):
    cmd, module = r.choice([("export-ct", "compressed_tensors"), ("check", "transformers"),
                            ("check", "tokenizers"), ("sensitivity", "transformers"),
                            ("calibrate", "tokenizers"), ("calibrate", "transformers")])
    return "case.json", json.dumps({"module": module, "cmd": cmd}).encode()


GENERATORS = {"outputs": outputs, "pt-cycles": pt_cycles, "imatrix": imatrix,
              "calibration": calibration, "roundtrip": roundtrip, "gguf-align": gguf_align,
              "truncation": truncation, "scale": scale, "optional": optional}
