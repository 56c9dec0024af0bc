"""Issue 20, class 7 for large tensors: data above PREAD_LIMIT is a loaders.region.Region, read
with pread by rows (never memory-mapped), so an input truncated under a running export is a
one-line error naming it, whatever the tensor's size; exports keep their bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import region
from workbench.formats.loaders.region import Region

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def matrix_file(tmp_path):
    a = np.arange(40 * 6, dtype=np.float32).reshape(40, 6)
    p = tmp_path / "m.bin"
    p.write_bytes(b"x" * 24 + a.tobytes())
    return p, a


def test_region_reads_rows_as_the_array_has_them(matrix_file):
    p, a = matrix_file
    r = Region(str(p), 24, np.float32, (a.size,)).reshape(40, -1)
    assert r.shape == a.shape and r.ndim == 2 and r.size == a.size and len(r) == 40
    assert r.nbytes == a.nbytes and r.dtype == np.float32
    for key in (slice(3, 9), slice(None), slice(35, 99), slice(-5, None), slice(7, 7)):
        got = r[key]
        assert isinstance(got, np.ndarray) and not got.flags.writeable
        np.testing.assert_array_equal(got, a[key])
    np.testing.assert_array_equal(r[4], a[4])
    np.testing.assert_array_equal(r[-1], a[-1])
    for idx in ([5, 1, 1, 39, 6, 7, 8, 0], np.array([], np.int64), np.array([-1, 2])):
        np.testing.assert_array_equal(r[idx], a[np.asarray(idx, np.int64)])
    np.testing.assert_array_equal(r[2:6, 1:3], a[2:6, 1:3])
    np.testing.assert_array_equal(r[3, 2], a[3, 2])
    np.testing.assert_array_equal(r[::2], a[::2])            # a step: the whole tensor read
    np.testing.assert_array_equal(np.asarray(r), a)
    np.testing.assert_array_equal(np.asarray(r, np.float64), a.astype(np.float64))
    assert r.max() == a.max()                                # other methods: on the whole
    np.testing.assert_array_equal(r.view(np.int32)[1:3], a.view(np.int32)[1:3])
    np.testing.assert_array_equal(r.reshape(8, 30)[1], a.reshape(8, 30)[1])
    with pytest.raises(IndexError):
        r[40]
    with pytest.raises(IndexError):
        r[[0, 40]]
    with pytest.raises(ValueError):
        r.reshape(7, -1)


def test_region_of_a_truncated_file_is_an_error_naming_it(matrix_file):
    p, a = matrix_file
    r = Region(str(p), 24, np.float32, a.shape)
    np.testing.assert_array_equal(r[:10], a[:10])
    os.truncate(p, 24 + 20 * 24)
    np.testing.assert_array_equal(r[:20], a[:20])
    with pytest.raises(WorkbenchError, match="truncated or replaced") as e:
        r[15:25]
    assert str(p) in str(e.value)
    with pytest.raises(WorkbenchError, match="truncated or replaced"):
        np.asarray(r)


def _source(tmp_path: Path) -> Path:
    """A model whose tensors take every kept / copied / quantized path: float and integer
    dtypes, 1-D to 3-D, rows that are not a multiple of the chunk."""
    import torch

    from workbench.export.st_writer import StreamingSafetensorsWriter
    rng = np.random.default_rng(1)
    p = tmp_path / "src.safetensors"
    w = StreamingSafetensorsWriter(str(p))
    w.add("blk.0.ffn_up.weight", rng.standard_normal((300, 64)).astype(np.float32))
    w.add("blk.0.ffn_down.weight", rng.standard_normal((64, 300)).astype(np.float16))
    bf = torch.from_numpy(rng.standard_normal((96, 64)).astype(np.float32)).to(torch.bfloat16)
    w.add("blk.0.attn_q.weight", bf.view(torch.int16).numpy().view(np.uint16), dtype="BF16")
    w.add("blk.0.attn_norm.weight", rng.standard_normal(64).astype(np.float32))
    w.add("pos_ids", np.arange(4000, dtype=np.int64).reshape(1000, 4))
    w.add("mask", rng.integers(0, 255, (500, 3)).astype(np.uint8))
    w.add("blk.0.conv.weight", rng.standard_normal((20, 3, 8)).astype(np.float32))
    w.finish()
    return p


def _export_all(model_path: Path, out: Path, small: bool, monkeypatch) -> dict:
    from workbench.export import export, gguf_tensor_data, quantized_safetensors
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    if small:   # every tensor a Region, every kept tensor in row slices
        monkeypatch.setattr(region, "PREAD_LIMIT", 0)
        monkeypatch.setattr(gguf_tensor_data, "KEPT_CHUNK_BYTES", 256)
        monkeypatch.setattr(quantized_safetensors, "KEPT_STREAM_BYTES", 0)
        monkeypatch.setattr(quantized_safetensors, "KEPT_CHUNK_BYTES", 256)
    out.mkdir()
    plans = {"keep": Plan(default="keep"), "q8": Plan(default="q8_0"),
             "mixed": Plan.from_dict({"format": "quant-workbench-plan", "version": 1,
                                      "default": "keep",
                                      "rules": [{"match": "re:ffn_up", "scheme": "q4_0"}]})}
    files = {}
    m = open_model(model_path)
    for name, plan in plans.items():
        for fmt in ("gguf", "safetensors"):
            target = out / f"{name}.{fmt}"
            run(export(m, plan, fmt, str(target)))
            files[target.name] = target.read_bytes()
    g = open_model(out / "keep.gguf")           # a GGUF source: tensors copied
    run(export(g, Plan(default="keep"), "gguf", str(out / "copy.gguf")))
    files["copy.gguf"] = (out / "copy.gguf").read_bytes()
    monkeypatch.undo()
    return files


def test_exports_are_the_same_bytes_read_by_rows(tmp_path, monkeypatch):
    src = _source(tmp_path)
    whole = _export_all(src, tmp_path / "whole", False, monkeypatch)
    rows = _export_all(src, tmp_path / "rows", True, monkeypatch)
    assert whole.keys() == rows.keys()
    for k in whole:
        assert whole[k] == rows[k], k


TRUNCATE_CLI = """
import os, sys
from workbench.formats.loaders import safetensors_format
src = sys.argv[1]
real = safetensors_format._File.raw
def raw_then_shrink(self, name):
    # another process truncates the input just after the export asked for a tensor's data
    out = real(self, name)
    if self.path == src and os.path.getsize(src) > 4096:
        os.truncate(src, 4096)
    return out
safetensors_format._File.raw = raw_then_shrink
from app.entry import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("fmt, plan", [("gguf", "q8_0"), ("gguf", "keep"),
                                       ("safetensors", "keep"), ("safetensors", "q4_0")])
def test_large_tensor_truncated_under_export_is_one_line_exit_2(tmp_path, fmt, plan):
    """A tensor above PREAD_LIMIT (lowered with QW_PREAD_LIMIT: a Region, read by rows): the
    file shrinking under the export is `<input>: ... truncated or replaced ...`, exit 2, and no
    output or temporary file is left; before, such a tensor was memory-mapped (SIGBUS)."""
    from workbench.export.st_writer import StreamingSafetensorsWriter
    src = tmp_path / "big.safetensors"
    w = StreamingSafetensorsWriter(str(src))
    w.add("blk.0.ffn_up.weight", np.ones((512, 256), np.float32))    # 512 KiB
    w.finish()
    out = tmp_path / "out" / f"o.{fmt}"
    out.parent.mkdir()
    how = ["--scheme", plan]
    if plan == "keep":   # every tensor stored unchanged: the copy path
        (tmp_path / "keep.json").write_text('{"format": "quant-workbench-plan", "version": 1, '
                                            '"default": "keep", "rules": []}')
        how = ["--plan", str(tmp_path / "keep.json")]
    env = dict(os.environ, PYTHONPATH=str(ROOT), QW_PREAD_LIMIT="65536")
    r = subprocess.run([sys.executable, "-c", TRUNCATE_CLI, str(src), "export", str(src),
                        *how, "--format", fmt, "-o", str(out)], env=env,
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])   # SIGBUS would be -7
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("quant-workbench: error: ") and str(src) in lines[0]
    assert "truncated or replaced" in lines[0]
    assert list(out.parent.iterdir()) == []
    assert os.path.getsize(src) == 4096


STRIDED_TORCH = """
import os, sys, numpy as np, torch
from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import open_model
d = sys.argv[1]
a = torch.arange(6000, dtype=torch.float32).reshape(60, 100)
b = torch.arange(3000, dtype=torch.float32).reshape(30, 100).to(torch.bfloat16)
sd = {"blk.0.ffn_up.weight": a.t(), "blk.0.x.weight": b[:, ::2], "c.weight": a[5:20, 10:50]}
p = os.path.join(d, "nc.pt")
torch.save(sd, p)
m = open_model(p)
for n, t in sd.items():
    assert not t.is_contiguous()
    want = t.contiguous()
    want = (want.view(torch.int16).numpy().view(np.uint16) if t.dtype == torch.bfloat16
            else want.numpy())
    got = np.asarray(m.raw(n))
    assert np.array_equal(got, want.reshape(got.shape)), n
os.truncate(p, 2000)
try:
    m.raw("blk.0.ffn_up.weight")
    print("NO ERROR")
except WorkbenchError as exc:
    print("ERROR", exc)
"""


def test_strided_torch_tensors_are_read_with_pread(tmp_path):
    """A tensor saved as a strided view (transposed, sliced) is read from the bytes it spans
    with pread (torch's .contiguous() would read its memory map: SIGBUS once truncated)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", STRIDED_TORCH, str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.startswith("ERROR") and "truncated or replaced" in r.stdout
    assert "nc.pt" in r.stdout


TRUNCATE = """
import os, sys, numpy as np, torch
from workbench.core.errors import WorkbenchError
from workbench.export import export
from workbench.export.st_writer import StreamingSafetensorsWriter
from workbench.formats.loaders import open_model
from workbench.quant.plan import Plan
from workbench.core.progress import run
d, kind = sys.argv[1], sys.argv[2]
src = os.path.join(d, "src.safetensors")
w = StreamingSafetensorsWriter(src)
for i in range(4):
    w.add(f"blk.{i}.ffn_up.weight", np.ones((64, 256), np.float32))
w.finish()
if kind == "gguf":
    run(export(open_model(src), Plan(default="fp16"), "gguf", os.path.join(d, "src.gguf")))
    src = os.path.join(d, "src.gguf")
elif kind == "pytorch":
    torch.save({f"blk.{i}.ffn_up.weight": torch.ones(64, 256) for i in range(4)},
               os.path.join(d, "src.pt"))
    src = os.path.join(d, "src.pt")
m = open_model(src)
os.truncate(src, os.path.getsize(src) // 2)
try:
    run(export(m, Plan(default="q8_0"), "gguf", os.path.join(d, "out.gguf")))
    print("EXPORTED")
except WorkbenchError as exc:
    print("ERROR", exc)
"""


@pytest.mark.parametrize("kind", ["safetensors", "gguf", "pytorch"])
def test_input_truncated_under_export_is_an_error_not_sigbus(tmp_path, kind):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", TRUNCATE, str(tmp_path), kind], env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]          # a SIGBUS would be -7
    assert r.stdout.startswith("ERROR") and "truncated or replaced" in r.stdout
    assert f"src.{'pt' if kind == 'pytorch' else kind}" in r.stdout
    assert not (tmp_path / "out.gguf").exists()
    assert not [p for p in tmp_path.iterdir() if "quant-workbench" in p.name]
