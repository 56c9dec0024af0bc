"""Case generators: seeds of each format, mutated. Each returns (file name, bytes)."""

from __future__ import annotations

import io
import json
import random
import struct
import zipfile

import numpy as np

BASE_AREAS = ("safetensors", "gguf", "pytorch", "quantized", "plan", "session")
#: the fuzz kinds beyond the base formats, one module pair each: tests/fuzz/cases_<m>.py
#: (GENERATORS: area -> case) and hostile.py or hostile_<m>.py (EXERCISES: area -> run);
#: a new kind is one line here and one in hostile.KIND_MODULES
KIND_MODULES = (
    "hostile",     # issue 20's classes, one input kind each
    "config",      # issue 32's config.json classes
    "cli",         # issue 32's classes 1, 4, 5, 7, 8 (the CLI on a tiny Llama folder)
    "blocks",      # issue 47's block-format headers
    "inputs",      # issue 47's imatrix and calibration inputs
    "nested",      # issue 47's nested configs
    "caches",      # issue 47's caches
    "api",         # issue 47's API arguments
    "mlx",         # issue 48's mlx-lm folders
)
DTYPES = ["F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64", "U8", "BOOL", "F8_E4M3",
          "Q4_0", "X", 7, None]
HUGE = [0, 1, 2, 3, 255, 256, 2**31 - 1, 2**31, 2**32, 2**40, 2**53, 2**62, 2**63, 2**64 - 1,
        -1, 134217728]


def _st(header: dict, data: bytes, pad=True) -> bytes:
    blob = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        blob += b" " * ((-len(blob)) % 8)
    return len(blob).to_bytes(8, "little") + blob + data


def _rand_shape(r: random.Random):
    k = r.choice([0, 1, 2, 2, 2, 3, 9])
    return [r.choice(HUGE + [r.randint(0, 64)] * 6) for _ in range(k)]


def safetensors(r: random.Random):
    n = r.randint(1, 4)
    header, data, off = {}, b"", 0
    for i in range(n):
        shape = [r.randint(0, 8), r.choice([0, 4, 32, 64])]
        nbytes = int(np.prod(shape)) * 4
        header[f"t{i}.weight"] = {"dtype": "F32", "shape": shape, "data_offsets": [off, off + nbytes]}
        data += np.random.default_rng(r.randint(0, 9999)).standard_normal(
            int(np.prod(shape))).astype(np.float32).tobytes()
        off += nbytes
    for _ in range(r.randint(1, 3)):
        name = r.choice(list(header))
        e = header[name]
        if not isinstance(e, dict):
            continue
        m = r.randint(0, 11)
        if m == 0:
            e["shape"] = _rand_shape(r)
        elif m == 1:
            e["dtype"] = r.choice(DTYPES)
        elif m == 2:
            e["data_offsets"] = [r.choice(HUGE), r.choice(HUGE)]
        elif m == 3:
            header[name] = r.choice([[], "x", 5, None, {"dtype": "F32"}])
        elif m == 4:
            header["__metadata__"] = r.choice([{"a": 1}, [], "x", {"quant_workbench": "{"}])
        elif m == 5:
            data = data[: r.randint(0, len(data))]
        elif m == 6:
            header[name + "\udc80"] = dict(e)
        elif m == 7:
            e["shape"] = [2**31, 2**31, 0]
            e["data_offsets"] = [0, 0]
        elif m == 8:
            e["data_offsets"] = [e["data_offsets"][0], e["data_offsets"][0]]
        elif m == 9:
            e["shape"] = [r.randint(0, 3)] * r.randint(0, 9)
        elif m == 10:
            e["extra"] = "y"
    try:
        raw = _st(header, data, pad=r.random() < 0.8)
    except (UnicodeEncodeError, ValueError):
        raw = _st({k.encode("utf-8", "replace").decode(): v for k, v in header.items()}, data)
    if r.random() < 0.2:  # byte-level damage too
        b = bytearray(raw)
        for _ in range(r.randint(1, 8)):
            b[r.randrange(len(b))] = r.randrange(256)
        raw = bytes(b)
    return "m.safetensors", raw


def _gguf_seed(r: random.Random) -> bytes:
    import gguf
    buf = io.BytesIO()
    # GGUFWriter needs a path: build in memory via a temp file
    import os
    import tempfile
    fd, path = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        w = gguf.GGUFWriter(path, "llama")
        w.add_uint32("llama.block_count", 1)
        w.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
        w.add_tensor("blk.0.attn_q.weight", np.ones((4, 32), np.float32))
        w.add_tensor("blk.0.attn_norm.weight", np.ones(32, np.float16))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with open(path, "rb") as fh:
            buf.write(fh.read())
    finally:
        os.unlink(path)
    return buf.getvalue()


_GGUF_SEED: bytes | None = None


def gguf_file(r: random.Random):
    global _GGUF_SEED
    if _GGUF_SEED is None:
        _GGUF_SEED = _gguf_seed(r)
    b = bytearray(_GGUF_SEED)
    m = r.randint(0, 5)
    if m == 0:      # a u64 field somewhere replaced by a huge value
        pos = r.randrange(8, min(len(b) - 8, 400))
        b[pos:pos + 8] = struct.pack("<Q", r.choice(HUGE) & (2**64 - 1))
    elif m == 1:
        for _ in range(r.randint(1, 16)):
            b[r.randrange(len(b))] = r.randrange(256)
    elif m == 2:
        b = b[: r.randint(0, len(b))]
    elif m == 3:    # a hostile header: array of 2**63 items / nested arrays
        b = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, 1))
        key = b"x.a"
        b += struct.pack("<Q", len(key)) + key
        depth = r.choice([1, 2, 1000])
        for _ in range(depth):
            b += struct.pack("<IIQ", 9, 9, 1)[:4]
            b += struct.pack("<IQ", 9, r.choice([1, 2**63, 16 << 20]))
        b += b"\0" * 64
    elif m == 4:    # u32 type fields changed
        pos = r.randrange(24, min(len(b) - 4, 400))
        b[pos:pos + 4] = struct.pack("<I", r.randrange(16))
    else:
        pos = r.randrange(8, min(len(b) - 8, 400))
        b[pos:pos + 8] = struct.pack("<Q", r.randrange(2**16))
    return "m.gguf", bytes(b)


def pytorch(r: random.Random):
    import torch
    m = r.randint(0, 6)
    sd = {"a.weight": torch.randn(4, 8), "b": torch.ones(3)}
    if m == 0:
        sd = {"w": torch.zeros(1).expand(2**15, 2**15)}
    elif m == 1:
        sd = {"a.b": torch.ones(2, 2), "a": {"b": torch.zeros(2, 2)}}
    elif m == 2:
        sd = {"p": torch.nn.Parameter(torch.ones(2, 4)), "e": torch.empty(3, 0),
              "i": torch.zeros((0, 4), dtype=torch.int64)}
    elif m == 3:
        sd = {"s": torch.eye(4).to_sparse()}
    buf = io.BytesIO()
    torch.save(sd, buf)
    raw = buf.getvalue()
    if m == 4:      # re-zip compressed
        src = zipfile.ZipFile(io.BytesIO(raw))
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            for info in src.infolist():
                z.writestr(info.filename, src.read(info.filename))
        raw = out.getvalue()
    elif m == 5:
        b = bytearray(raw)
        for _ in range(r.randint(1, 12)):
            b[r.randrange(len(b))] = r.randrange(256)
        raw = bytes(b)
    elif m == 6:
        raw = raw[: r.randint(0, len(raw))] if r.random() < 0.5 else b"plain text file\n" * 3
    return "m.pt", raw


def quantized(r: random.Random):
    """A real quantized-safetensors export with its metadata edited."""
    from workbench.formats.loaders.quantized_format import META_KEY
    base = _QUANT_SEED(r)
    n = int.from_bytes(base[:8], "little")
    header = json.loads(base[8:8 + n])
    meta = json.loads(header["__metadata__"][META_KEY])
    t = meta["tensors"]["w"]
    m = r.randint(0, 6)
    if m == 0:
        t["scheme"] = r.choice(["int4-g32", "int4-g32-asym", "int8-channel", "q4_0", "q8_0",
                                "nf4-g64", "fp16", "nope"])
    elif m == 1:
        t["shape"] = _rand_shape(r)
    elif m == 2:
        t["arrays"] = r.choice([[], ["codes"], ["zeros", "codes", "scales"], "x", None])
    elif m == 3:
        meta["version"] = r.choice([2, "1", None, 1.0])
    elif m == 4:
        meta["tensors"] = r.choice([[], None, {"w": 5}])
    elif m == 5:
        t["shape"] = [t["shape"][1], t["shape"][0]]
    else:
        t["dtype"] = r.choice(["F16", "X", 3])
    header["__metadata__"][META_KEY] = json.dumps(meta)
    return "q.safetensors", _st(header, base[8 + n:])


def _QUANT_SEED(r: random.Random, _cache={}):  # noqa: B006 - a per-process cache
    if "raw" not in _cache:
        import os
        import tempfile

        from workbench.export import export
        from workbench.export.st_writer import StreamingSafetensorsWriter
        from workbench.formats.loaders import open_model
        from workbench.quant.plan import Plan
        from workbench.core.progress import run
        d = tempfile.mkdtemp()
        w = StreamingSafetensorsWriter(os.path.join(d, "src.safetensors"))
        w.add("w", np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32))
        w.finish()
        run(export(open_model(os.path.join(d, "src.safetensors")), Plan(default="int4-g32-asym"),
                   "safetensors", os.path.join(d, "q.safetensors")))
        with open(os.path.join(d, "q.safetensors"), "rb") as fh:
            _cache["raw"] = fh.read()
    return _cache["raw"]


def _rand_json(r: random.Random, depth=0):
    k = r.randint(0, 7 if depth < 4 else 3)
    if k == 0:
        return r.choice(HUGE + [1.5, float("nan") if r.random() < 0.1 else 0.0])
    if k == 1:
        return r.choice(["", "keep", "q4_k", "int8-channel", "re:(", "re:([a-z._0-9]+)+!",
                         "re:a{4294967296}", "re:(a)\\1", "\udc80", "x" * 300])
    if k == 2:
        return None
    if k == 3:
        return r.choice([True, False])
    if k in (4, 5):
        return [_rand_json(r, depth + 1) for _ in range(r.randint(0, 3))]
    return {r.choice(["format", "version", "default", "rules", "match", "scheme", "fallback",
                      "model", "plan", "tiers", "ui"]): _rand_json(r, depth + 1)
            for _ in range(r.randint(0, 4))}


def plan(r: random.Random):
    base = {"format": "quant-workbench-plan", "version": 1, "default": "q8_0",
            "rules": [{"match": "re:q_proj", "scheme": "q4_k"}]}
    m = r.randint(0, 5)
    if m == 0:
        text = json.dumps(_rand_json(r))
    elif m == 1:
        base[r.choice(list(base))] = _rand_json(r)
        text = json.dumps(base)
    elif m == 2:
        base["rules"].append({"match": _rand_json(r), "scheme": _rand_json(r)})
        text = json.dumps(base)
    elif m == 3:
        text = "[" * r.choice([10, 100, 100000]) + "]" * 3
    elif m == 4:
        text = '{"version": 1, "version": 1, "default": "' + "9" * r.choice([10, 5000]) + '"}'
    else:
        text = json.dumps(base)
        b = list(text)
        for _ in range(r.randint(1, 5)):
            b[r.randrange(len(b))] = chr(r.randrange(32, 127))
        text = "".join(b)
    try:
        raw = text.encode("utf-8", "surrogatepass")
    except UnicodeEncodeError:
        raw = text.encode("utf-8", "replace")
    return "plan.json", raw


def session(r: random.Random):
    name, raw = plan(r)
    if r.random() < 0.5:
        d = {"format": "quant-workbench-session", "version": 1, "model": "/nonexistent",
             "plan": json.loads(plan(random.Random(0))[1]) if False else
             {"format": "quant-workbench-plan", "version": 1, "default": "q8_0", "rules": []},
             "tiers": _rand_json(r), "ui": _rand_json(r)}
        raw = json.dumps(d).encode()
    return "s.qwsession", raw


GENERATORS = {"safetensors": safetensors, "gguf": gguf_file, "pytorch": pytorch,
              "quantized": quantized, "plan": plan, "session": session}


def _kinds() -> dict:
    import importlib
    out = {}
    for m in KIND_MODULES:
        out.update(importlib.import_module(f"{__package__}.cases_{m}").GENERATORS)
    return out


GENERATORS.update(_kinds())
AREAS = tuple(GENERATORS)
