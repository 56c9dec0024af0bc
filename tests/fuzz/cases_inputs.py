"""Generators for issue 47's input kinds (tests/fuzz/hostile_inputs.py carries them out on the
bundled demo model, a qwen2 of 3 blocks, vocab_size 512):

    r5-imatrix      imatrix GGUF and legacy .dat files: the model's whole set of entries, a
                    part of it, another model's names, the two mixed, a vector of the wrong
                    width; then truncated, bytes flipped, counts and lengths replaced by huge
                    ones; and (a JSON spec) sparse files of up to 64 GiB behind a valid first
                    entry, or one entry / GGUF tensor past the bound on values
    r5-calibration  .npy headers (versions 1-3, every dtype kind, huge / negative / odd
                    shapes, Fortran order, a header longer than the file), token ids outside
                    the vocabulary at any position, JSONL records (missing or non-string
                    "text", nested, 1 MiB texts either side of the limit), text lines either
                    side of the limit, non-UTF-8, empty, safetensors input_ids; valid ones

The file name says what must happen: ``ok-*`` must work, ``bad-*`` must be refused, ``any-*``
either; r5-imatrix's ``<mode>-<k>`` carries the entries that match (the warning's count).
"""

from __future__ import annotations

import io
import json
import random
import struct

import numpy as np

BLOCKS, VOCAB, MAX_LINE = 3, 512, 1 << 20
DEMO_NAMES = [f"blk.{b}.{t}.weight" for b in range(BLOCKS)
              for t in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                        "ffn_down")] + ["output.weight"]
FOREIGN_NAMES = ["blk.0.attn_qkv.weight", "model.layers.0.mlp.fc1.weight", "blk.9.ffn_up.weight",
                 "enc.0.attn.weight", "blk.0.ffn_up_exps.weight", "token_types.weight",
                 "blk.0.attn_q.weight\u00e9", "output_norm.weight ", "x" * 300]


def _width(name: str) -> int:
    return 512 if name.endswith("ffn_down.weight") else 256


def _dat(entries) -> bytes:
    out = struct.pack("<i", len(entries))
    for name, vals in entries:
        nb = name.encode()
        out += struct.pack("<i", len(nb)) + nb + struct.pack("<ii", 4, len(vals))
        out += np.asarray(vals, "<f4").tobytes()
    return out


def _gguf(entries) -> bytes:
    from .cases_hostile import _imatrix_gguf
    return _imatrix_gguf(_Always(), [(n, 4, v) for n, v in entries])


class _Always(random.Random):
    """cases_hostile._imatrix_gguf's choices fixed: an imatrix type, F32 sums, counts."""
    def choice(self, seq):
        return seq[0]

    def random(self):
        return 0.0


def r5_imatrix(r: random.Random):
    rng = np.random.default_rng(r.randint(0, 9999))
    mode = r.choice(["full", "partial", "partial", "foreign", "mixed", "width", "truncated",
                     "flipped", "huge", "sparse"])
    if mode == "sparse":
        return "sparse-0.json", json.dumps({
            "form": r.choice(["dat-tail", "dat-nval", "gguf-tensor"]),
            "size": r.choice([1 << 30, 8 << 30, 64 << 30]),
            "nval": r.choice([(1 << 26) + 1, 1 << 28, (1 << 30) - 1])}).encode()
    names = list(DEMO_NAMES)
    if mode in ("partial", "mixed"):
        names = r.sample(names, r.randint(1, len(names) - 1))
    elif mode == "foreign":
        names = r.sample(FOREIGN_NAMES, r.randint(1, 4))
    k = len([n for n in names if n in DEMO_NAMES])
    entries = [(n, np.abs(rng.standard_normal(_width(n))).astype(np.float32) + 0.01)
               for n in names]
    if mode == "mixed":
        entries += [(n, np.ones(256, np.float32)) for n in r.sample(FOREIGN_NAMES, 2)]
    if mode == "width":
        n, v = entries[0]
        entries[0] = (n, v[: r.choice([1, 8, 255])] if r.random() < 0.5 else np.ones(1024))
    gguf = r.random() < 0.5
    raw = bytearray(_gguf(entries) if gguf else _dat(entries))
    if mode == "truncated":
        raw = raw[: r.randint(0, len(raw) - 1)]
    elif mode == "flipped":
        for _ in range(r.randint(1, 12)):
            raw[r.randrange(len(raw))] = r.randrange(256)
    elif mode == "huge":
        big = r.choice([2**31 - 1, 2**30, 10**9, 1 << 26, -1, -2**31])
        if gguf:                        # a u64 of the header (tensor / kv counts, lengths, dims)
            pos = r.choice([8, 16]) if r.random() < 0.5 else r.randrange(24, min(len(raw) - 8,
                                                                                   400))
            raw[pos:pos + 8] = struct.pack("<q", big)
        else:                           # the entry count, the first name length or nval
            pos = r.choice([0, 4, 8 + len(names[0].encode()) + 4])
            raw[pos:pos + 4] = struct.pack("<i", big)
    ext = "gguf" if gguf else "dat"
    return f"{mode}-{k}.imatrix.{ext}", bytes(raw)


# ---- calibration ----------------------------------------------------------------------------
def _npy(header: str, version=(1, 0), data: bytes = b"", pad: bool = True) -> bytes:
    h = header
    if pad:
        h += " " * ((64 - (10 + len(h) + 1) % 64) % 64)
    h += "\n"
    if version == (1, 0):
        head = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h))
    else:
        head = b"\x93NUMPY" + bytes(version) + struct.pack("<I", len(h))
    return head + h.encode("latin1" if version != (3, 0) else "utf-8") + data


def _save(a, **kw) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, **kw)
    return buf.getvalue()


def _npy_case(r: random.Random):
    m = r.randint(0, 5)
    if m == 0:                      # a header claiming far more than the file holds
        shape = r.choice([(10**11,), (2**20, 2**20), (2**40, 1), (2**62,), (3, 2**61)])
        descr = r.choice(["<i8", "<i4", "|u1", ">i2", "<u8"])
        return "bad-claims.npy", _npy("{'descr': '%s', 'fortran_order': False, 'shape': %r, }"
                                      % (descr, shape), r.choice([(1, 0), (2, 0), (3, 0)]),
                                      b"\0" * r.choice([0, 64, 4096]))
    if m == 1:                      # not a valid header
        hdr = r.choice(["{'descr': '<i8', 'fortran_order': False, 'shape': (-3,), }",
                        "{'descr': '<i8', 'fortran_order': False, 'shape': ('a',), }",
                        "{'descr': '<i8', 'shape': (3,), }", "[1, 2, 3]", "{", "",
                        "{'descr': 'x9', 'fortran_order': False, 'shape': (3,), }",
                        "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), 'z': 1}",
                        "{'descr': '<i8', 'fortran_order': 0, 'shape': (2,), }",
                        "{'descr': '<i8', 'fortran_order': False, 'shape': " + "(" * 200])
        return "bad-header.npy", _npy(hdr, r.choice([(1, 0), (2, 0), (9, 9)]), b"\0" * 64,
                                      pad=r.random() < 0.7)
    if m == 2:                      # dtypes that are not token ids
        a = r.choice([np.ones((2, 4), np.float32), np.ones(4, np.bool_),
                      np.array(["ab", "c"]), np.ones(3, np.complex64),
                      np.zeros(2, dtype=[("a", "<i4")]), np.ones(3, np.float16)])
        return "bad-dtype.npy", _save(a)
    if m == 3:                      # shapes the reader does not take
        a = r.choice([np.ones((2, 2, 2), np.int64), np.int64(7), np.zeros((0,), np.int64),
                      np.zeros((3, 0), np.int32), np.zeros((0, 5), np.int64)])
        return "bad-shape.npy", _save(np.asarray(a))
    if m == 4:                      # a valid file in another byte order / Fortran order / width
        a = np.arange(r.randint(1, 600), dtype=np.int64) % VOCAB
        if r.random() < 0.5:
            a = a[: (len(a) // 4) * 4 or 4].reshape(-1, 4) if len(a) >= 4 else a
        a = a.astype(r.choice([np.int64, np.int32, np.uint16, ">i8", ">u4", np.int8
                               if a.max() < 128 else np.int16]))
        if a.ndim == 2 and r.random() < 0.5:
            a = np.asfortranarray(a)
        return "ok-ids.npy", _save(a)
    raw = bytearray(_save(np.arange(64, dtype=np.int64).reshape(4, 16)))
    if r.random() < 0.5:
        raw = raw[: r.randint(0, len(raw) - 1)]
    else:
        for _ in range(r.randint(1, 6)):
            raw[r.randrange(len(raw))] = r.randrange(256)
    return "any-damaged.npy", bytes(raw)


def _oov_case(r: random.Random):
    rows, cols = r.choice([(1, 40), (3, 200), (4, 16), (1, 1)])
    a = np.asarray(np.random.default_rng(r.randint(0, 99)).integers(0, VOCAB, (rows, cols)))
    bad = r.choice([VOCAB, VOCAB + 1, 10**6, 2**40, -1, -2**40, 2**62])
    a[r.randrange(rows), r.randrange(cols)] = bad
    if r.random() < 0.4:
        a = a.reshape(-1)
    dt = np.int64 if abs(bad) >= 2**31 else r.choice([np.int64, np.int32])
    if r.random() < 0.3:
        from .cases import _st
        x = a.astype(np.int64)
        return "bad-oov.safetensors", _st({"input_ids": {"dtype": "I64", "shape": list(x.shape),
                                                         "data_offsets": [0, x.nbytes]}},
                                          x.tobytes())
    return "bad-oov.npy", _save(a.astype(dt))


def _jsonl_case(r: random.Random):
    good = json.dumps({"text": "hello there, general"})
    bad = r.choice([('{"txt": "x"}', "bad"), ('{"text": 5}', "bad"), ("[1, 2]", "bad"),
                    ("not json", "bad"), ('"just a string"', "bad"),
                    ("[" * 100000 + "]" * 100000, "bad"), ('{"a": ' + "9" * 5000 + "}", "bad"),
                    (json.dumps({"text": "b" * (MAX_LINE + 1)}), "bad"),
                    (json.dumps({"text": "b" * MAX_LINE}), "ok"),
                    (json.dumps({"text": "c", "meta": {"x": [1] * 10}}), "ok"),
                    (json.dumps({"text": "\u00e9\u4e00 ok"}), "ok"), ("", "ok"),
                    (json.dumps({"text": "   "}), "ok"), ('{"text": "a", "text": "b"}', "bad")])
    lines = [good] * r.randint(1, 3) + [bad[0]] + [good] * r.randint(0, 3)
    sep = r.choice(["\n", "\r\n"])
    return f"{bad[1]}-records.jsonl", sep.join(lines).encode()


def _text_case(r: random.Random):
    m = r.randint(0, 4)
    if m == 0:                      # one line either side of the limit
        n = r.choice([MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 5 << 20])
        ch = r.choice(["a", "\u00e9", "\u4e00"])
        return ("ok" if n <= MAX_LINE else "bad") + "-line.txt", \
            ("hello\n" + ch * n + "\nworld\n").encode()
    if m == 1:
        return "bad-utf8.txt", r.choice([b"\xff\xfe\x00abc\n", b"ok line\n\xc3\x28\n",
                                         b"\xed\xa0\x80 surrogate\n"])
    if m == 2:
        return "bad-empty.txt", r.choice([b"", b"\n\n  \n", b"\t\r\n"])
    if m == 3:
        return "ok-text.txt", r.choice([b"the quick brown fox\njumps over the lazy dog\n",
                                        b"\xef\xbb\xbfbom first\nsecond\n", b"a\rb\rc\n",
                                        b"nul \x00 inside\n", "\u4e00\u4e8c\n".encode()])
    return "ok-many.txt", ("\n".join(f"sample {i} text" for i in range(r.randint(1, 400)))
                           ).encode()


def r5_calibration(r: random.Random):
    if r.random() < 0.05:           # a sparse .npy past the token limit (a JSON spec)
        return "sparse-npy.json", json.dumps({"ids": r.choice([(1 << 26) + 1, 1 << 30])}).encode()
    return r.choice([_npy_case, _npy_case, _oov_case, _jsonl_case, _text_case, _text_case])(r)


GENERATORS = {"r5-imatrix": r5_imatrix, "r5-calibration": r5_calibration}
