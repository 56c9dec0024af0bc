"""What the fuzz worker does with issue 47's input kinds r5-imatrix and r5-calibration
(tests/fuzz/cases_inputs.py), on the bundled demo model through the API and, for some cases,
the CLI in-process. Returns for a correct result, raises WorkbenchError for a clean refusal and
Finding for a defect: another exception, a refusal that does not name the file or says the
wrong thing, a file that must work refused (or one that must be refused taken), a missing or
wrong warning for a partial imatrix, a calibration input that passed the early check but is
refused when it is read, ids outside the vocabulary or samples past max_len accepted.
"""

from __future__ import annotations

import json
import os
import random
import struct
import tempfile
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "resources" / "demo_model"
N_MATRICES = 22                     # the demo's weight matrices (3 blocks of 7 + lm_head)
_MODEL: list = []


def _h():
    from . import hostile
    return hostile


def _model():
    if not _MODEL:
        import workbench as qw
        _MODEL.append(qw.open_model(DEMO))
    return _MODEL[0]


class _WorkStarted(Exception):
    pass


def _no_work(job):
    job.close()
    raise _WorkStarted()


def _named(exc: WorkbenchError, p: Path) -> None:
    msg = str(exc)
    if p.name not in msg or "\n" in msg:
        raise _h().Finding(f"refusal does not name {p.name} in one line: {msg[:300]}")


# ---- r5-imatrix -----------------------------------------------------------------------------
def _sparse_imatrix(spec: dict, d: Path) -> Path:
    name = b"blk.0.attn_q.weight"
    if spec["form"] == "gguf-tensor":
        import gguf
        p = d / "sparse.imatrix.gguf"
        w = gguf.GGUFWriter(str(p), arch="")
        w.add_type("imatrix")
        n = spec["nval"]
        w.add_tensor_info(name.decode() + ".in_sum2", (1, n), np.dtype(np.float32), n * 4)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        with open(p, "r+b") as f:
            f.truncate(os.path.getsize(p) + 64 + 4 * n)
        return p
    p = d / "sparse.imatrix.dat"
    nval = 256 if spec["form"] == "dat-tail" else spec["nval"]
    with open(p, "wb") as f:
        f.write(struct.pack("<i", 2) + struct.pack("<i", len(name)) + name
                + struct.pack("<ii", 1, nval))
        if spec["form"] == "dat-tail":
            f.write(np.ones(256, "<f4").tobytes())
        f.truncate(max(spec["size"], 4 * nval + 64))
    return p


def exercise_imatrix(path: str) -> None:
    import workbench as qw
    p = Path(path)
    mode, k = p.name.split(".")[0].rsplit("-", 1)
    k = int(k)
    if p.suffix == ".json":
        p = _sparse_imatrix(json.loads(p.read_text()), p.parent)
    r = random.Random(p.name + str(p.stat().st_size))
    how = r.choice(["sensitivity", "sensitivity", "evaluate", "cli-export"])
    said: list[str] = []
    try:
        if how == "sensitivity":
            qw.measure_sensitivity(_model(), "q4_k", measure="activation", imatrix=p,
                                   say=said.append)
        elif how == "evaluate":
            qw.evaluate_plan(_model(), "int4-g128", method="imatrix", imatrix=p)
        else:
            out = Path(tempfile.mkdtemp(prefix="qw-r5-", dir=p.parent)) / "o.gguf"
            rc, err = _h().cli(["export", DEMO, "--scheme", "q4_k", "--format", "gguf",
                                "--method", "imatrix", "--imatrix", p, "-o", out])
            said = [ln for ln in err.splitlines() if ln.startswith("warning: the imatrix")]
            if rc == 2:
                line = err.strip().splitlines()[-1]
                if out.exists():
                    raise _h().Finding(f"refused but wrote {out}")
                raise WorkbenchError(line)
            if rc != 0:
                raise _h().Finding(f"exit {rc}: {err[-600:]}")
    except WorkbenchError as exc:
        _named(exc, p)
        if mode == "foreign" and "names none of the model's tensors" not in str(exc):
            raise _h().Finding(f"another model's imatrix refused for another reason: {exc}")
        if mode in ("full", "partial", "mixed"):
            raise _h().Finding(f"a valid imatrix ({mode}, {k} entries) refused: {exc}")
        if mode == "sparse" and "at most" not in str(exc) and "0 bytes" not in str(exc):
            raise _h().Finding(f"a sparse imatrix refused for another reason: {exc}")
        raise
    if mode in ("foreign", "width", "sparse"):
        raise _h().Finding(f"an imatrix that must be refused ({mode}) was taken")
    warn = [ln for ln in said if "has no entry for" in ln]
    if how != "evaluate" and mode in ("full", "partial", "mixed"):
        want = N_MATRICES - k
        if (want == 0) != (not warn) or len(warn) > 1 or (
                warn and f"has no entry for {want:,} weight matrices" not in warn[0]):
            raise _h().Finding(f"{mode} imatrix with {k} of {N_MATRICES} entries: "
                               f"warnings {warn}")


# ---- r5-calibration -------------------------------------------------------------------------
def _sparse_npy(spec: dict, d: Path) -> Path:
    n = spec["ids"]
    p = d / "sparse.npy"
    h = "{'descr': '<i8', 'fortran_order': False, 'shape': (%d,), }" % n
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    with open(p, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
        f.truncate(f.tell() + 8 * n)
    return p


def _entry(model, p: Path, r: random.Random):
    import workbench as qw
    return r.choice([
        lambda: qw.check_plan(model, "q8_0", calib=p, scoring="lines", driver=_no_work),
        lambda: qw.check_plan(model, "q8_0", held_out=p, scoring="lines", driver=_no_work),
        lambda: qw.measure_sensitivity(model, "q4_0", measure="fisher", calib=p,
                                       driver=_no_work),
        lambda: qw.export_plan(model, "q4_0", "gguf", p.parent / "o.gguf", method="gptq",
                               calib=p, driver=_no_work),
        lambda: qw.compute_frontier(model, schemes="q4_0,q8_0", calib=p, driver=_no_work),
        lambda: qw.evaluate_plan(model, "int4-g128", method="awq", calib=p, driver=_no_work)])


def exercise_calibration(path: str) -> None:
    from workbench.core.progress import run
    from workbench.running.calibration import calibration_samples
    p = Path(path)
    expect = p.name.split("-")[0]
    if p.suffix == ".json":
        p, expect = _sparse_npy(json.loads(p.read_text()), p.parent), "bad"
    model = _model()
    r = random.Random(p.name + str(p.stat().st_size))
    if r.random() < 0.15:           # the CLI, in-process: exit 0 or one line naming the file
        rc, err = _h().cli(["calibrate", DEMO, "--calib", p, "--samples", "2", "-o",
                            p.parent / "im.gguf"])
        if rc not in (0, 2) or (rc == 2 and (str(p) not in err or "\n" in err.strip())):
            raise _h().Finding(f"calibrate: exit {rc}: {err[-600:]}")
        if (rc == 0) != (expect != "bad") and expect != "any":
            from workbench.running.calibration import vocab_size
            raise _h().Finding(f"calibrate on {p.name} (must be {expect}): exit {rc}: "
                               f"{err[-300:]!r}; vocab_size {vocab_size(_model())}")
        if rc == 2:
            raise WorkbenchError(err.strip())
        return
    try:
        _entry(model, p, r)()
    except _WorkStarted:
        pass
    except WorkbenchError as exc:
        _named(exc, p)
        if expect == "ok":
            raise _h().Finding(f"a valid input refused: {exc}") from None
        raise
    if expect == "bad":
        raise _h().Finding(f"an input that must be refused passed the early check: {p.name}")
    try:
        out = run(calibration_samples(model, p, None, 128))
    except WorkbenchError as exc:
        raise _h().Finding(f"passed the early check, refused when read: {exc}") from None
    for s in out:
        if s.size and (s.min() < 0 or s.max() >= 512) or len(s) > 128:
            raise _h().Finding(f"a sample outside the vocabulary or past max_len: {p.name}")


EXERCISES = {"r5-imatrix": exercise_imatrix, "r5-calibration": exercise_calibration}
