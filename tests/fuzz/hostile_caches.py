"""What the fuzz worker does with issue 47's r5-caches kind (tests/fuzz/cases_caches.py): two
entries written through a cache's own writer, one damaged, both read back through the cache's
own reader. Returns for a correct outcome (the original payload, or a miss with the damaged
entry removed; the neighbour served intact); raises Finding for other data served, a valid
entry not served, a bad entry left behind, or any exception from a reader.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np


def _h():
    from . import hostile
    return hostile


class _Kind:
    """A cache's writer, reader and entry paths for one kind (its folders under `root`)."""

    def __init__(self, kind: str, root: Path, rng: random.Random, spec: dict):
        from workbench.core import cache as C
        self.kind, self.root, self.rng, self.spec = kind, root, rng, spec
        if kind == "generic":
            self.cache = C.Cache("fuzz", ".bin", 8, folder=root / "generic")
        elif kind == "kld":
            from workbench.running import kld
            self.cache = kld._cache()
        elif kind == "base":
            from workbench.export import llama_kld
            self.cache = llama_kld._cache(root / "base")
        else:
            from workbench.planning import output_measure
            self.cache = output_measure._cache()

    def payload(self):
        r, s = self.rng, self.spec
        if self.kind == "generic":
            return r.randbytes(r.randint(1, 5000))
        if self.kind == "kld":
            g = np.random.default_rng(s["seed"])
            n, w, vocab = s["rows"], s["width"], 97
            return {"ids": g.integers(0, vocab, (n, w)).astype(np.int64),
                    "logp": -np.abs(g.standard_normal((n, w))).astype(np.float32),
                    "tail": -np.abs(g.standard_normal(n)).astype(np.float32),
                    "nll": np.abs(g.standard_normal(n)).astype(np.float32)}
        if self.kind == "base":
            import struct
            ctx, n_vocab, n_chunk = 8, s["width"], 1 + s["rows"] % 3
            nv = 2 * ((n_vocab + 1) // 2) + 4
            body = r.randbytes(4 * n_chunk * ctx + n_chunk * (ctx - 1 - ctx // 2) * nv * 2)
            return b"_logits_" + struct.pack("<iii", ctx, n_vocab, n_chunk) + body
        return {f"t{i}|q4_0": r.random() for i in range(s["rows"])}

    def write(self, key: str, value) -> None:
        if self.kind == "generic":
            ok = self.cache.put_bytes(key, value)
        elif self.kind == "kld":
            from workbench.running import kld
            ok = kld.write_cache(key, value, {"fuzz": 1})
        elif self.kind == "base":
            from workbench.export import llama_kld
            tmp = self.cache.temp(key)
            tmp.write_bytes(value)
            ok = self.cache.put_file(
                key, tmp, verify=lambda p: llama_kld.base_file_problem(p) is None) is not None
        else:
            from workbench.planning import output_measure
            output_measure._write_cache(key, value)
            ok = self.cache.record(key).is_file()
        if not ok:
            raise RuntimeError("the generator could not write its entry")

    def read(self, key: str):
        """The value read back (None on a miss)."""
        if self.kind == "generic":
            return self.cache.get_bytes(key)
        if self.kind == "kld":
            from workbench.running import kld
            s = self.spec
            return kld.read_cache(key, s["rows"], s["width"], 97)
        if self.kind == "base":
            from workbench.export import llama_kld
            p = llama_kld.cached_base(key, self.root / "base")
            return None if p is None else p.read_bytes()
        from workbench.planning import output_measure
        return output_measure._read_cache(key) or None

    @staticmethod
    def same(a, b) -> bool:
        if isinstance(a, dict) and a and isinstance(next(iter(a.values())), np.ndarray):
            return set(a) == set(b) and all(
                np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)
        return a == b


def _damage(spec: dict, rng: random.Random, k1: str, k2: str, kind: _Kind) -> bool:
    """Damage entry k1 as the spec says; whether its bytes or record changed."""
    p, rec = kind.cache.path(k1), kind.cache.record(k1)
    p2, rec2 = kind.cache.path(k2), kind.cache.record(k2)
    d = spec["damage"]
    st = os.stat(p)
    data = p.read_bytes()
    if d == "none":
        return False
    if d in ("truncate", "extend", "flip", "zero"):
        b = bytearray(data)
        at = int(spec["pos"] * (len(b) - 1))
        if d == "truncate":
            b = b[:at]
        elif d == "extend":
            b += rng.randbytes(spec["count"])
        elif d == "flip":
            for _ in range(spec["count"]):
                i = rng.randrange(len(b))
                b[i] ^= rng.randint(1, 255)
        else:
            b[at:at + spec["count"]] = bytes(len(b[at:at + spec["count"]]))
        p.write_bytes(bytes(b))
        if spec["keep_mtime"]:
            os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
        return bytes(b) != data
    if d in ("foreign", "foreign-record"):
        shutil.copy(p2, p)
        if d == "foreign-record":
            shutil.copy(rec2, rec)
        return True
    if d in ("wrong-key", "record-bytes", "record-checksum"):
        r = json.loads(rec.read_text())
        if d == "wrong-key":
            r["key"] = k2
        elif d == "record-bytes":
            r["bytes"] = r["bytes"] + rng.choice([-1, 1, 4096, -r["bytes"]])
        else:
            r["sha256"] = ("0" if r["sha256"][0] != "0" else "1") + r["sha256"][1:]
        rec.write_text(json.dumps(r))
        return True
    if d == "record-garbage":
        rec.write_text(spec["garbage"])
        return True
    if d == "record-missing":
        rec.unlink()
        return True
    p.unlink()
    if d == "payload-link":
        p.symlink_to(p2)
    elif d == "payload-fifo":
        os.mkfifo(p)
    elif d == "payload-dir":
        p.mkdir()
    return True


def exercise(path: str) -> None:
    from workbench.core import cache as C
    from workbench.core.errors import WorkbenchError
    Finding = _h().Finding
    spec = json.loads(Path(path).read_text())
    rng = random.Random(spec["seed"])
    root = Path(path).parent / "caches"
    root.mkdir()
    saved = {k: os.environ.get(k) for k in ("XDG_CACHE_HOME", "QUANT_WORKBENCH_KLD_CACHE")}
    os.environ["XDG_CACHE_HOME"] = str(root / "xdg")
    os.environ["QUANT_WORKBENCH_KLD_CACHE"] = str(root / "kld")
    C._MEMO.clear()
    try:
        kind = _Kind(spec["kind"], root, rng, spec)
        k1, k2 = C.make_key(["fuzz", 1, spec["seed"]]), C.make_key(["fuzz", 2, spec["seed"]])
        v1, v2 = kind.payload(), kind.payload()
        kind.write(k1, v1)
        kind.write(k2, v2)
        changed = _damage(spec, rng, k1, k2, kind)
        what = f"{spec['kind']} entry, damage {spec['damage']}"
        try:
            got = kind.read(k1)
            again = kind.read(k1)
            other = kind.read(k2)
        except WorkbenchError as exc:
            raise Finding(f"{what}: the reader raised: {exc}") from None
        if got is None:
            if not changed:
                raise Finding(f"{what}: a valid entry was not served")
            left = [q.name for q in (kind.cache.path(k1), kind.cache.record(k1))
                    if q.is_symlink() or (q.exists() and not q.is_dir())]
            if left:
                raise Finding(f"{what}: the bad entry was left behind: {left}")
            if again is not None:
                raise Finding(f"{what}: a removed entry was served on the next read")
        elif not kind.same(got, v1):
            raise Finding(f"{what}: other data was served for the key")
        if other is None or not kind.same(other, v2):
            raise Finding(f"{what}: the neighbour entry was not served intact")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        C._MEMO.clear()
        with contextlib.suppress(OSError):
            shutil.rmtree(root)


EXERCISES = {"r5-caches": exercise}
