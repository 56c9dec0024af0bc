"""safetensors loading: single file, shards, folders, every dtype, laziness."""

from __future__ import annotations

import json
import os
import resource

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import open_model

ALL_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "I8": torch.int8, "I16": torch.int16, "I32": torch.int32, "I64": torch.int64,
    "U8": torch.uint8, "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64,
    "BOOL": torch.bool,
}


def _tensor_of(dtype: torch.dtype, shape, gen) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        x = torch.randn(shape, generator=gen, dtype=torch.float32) * 3
        x.view(-1)[0] = 0.0
        x.view(-1)[1] = -1.5
        return x.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = max(info.min, -1000), min(info.max, 1000)
    t = torch.randint(lo, hi, shape, generator=gen, dtype=torch.int64).to(dtype)
    # the extremes of the type must survive too
    if dtype not in (torch.uint16, torch.uint32, torch.uint64):
        t.view(-1)[0] = info.min
        t.view(-1)[1] = info.max
    return t


@pytest.fixture(scope="module")
def all_dtype_file(tmp_path_factory):
    gen = torch.Generator().manual_seed(0)
    tensors = {f"t_{k.lower()}": _tensor_of(d, (5, 7), gen) for k, d in ALL_DTYPES.items()}
    # big unsigned values beyond the signed range (written through the raw bits)
    u64 = torch.tensor([2**64 - 1, 2**63, 0, 1], dtype=torch.uint64)
    tensors["t_u64_big"] = u64.reshape(2, 2)
    path = tmp_path_factory.mktemp("dt") / "all.safetensors"
    save_file(tensors, str(path))
    return path, tensors


@pytest.mark.parametrize("st_name", list(ALL_DTYPES))
def test_every_dtype_reads_back_exactly(all_dtype_file, st_name):
    path, tensors = all_dtype_file
    name = f"t_{st_name.lower()}"
    m = open_model(path)
    info = m.info(name)
    assert info.dtype == st_name
    assert info.shape == (5, 7)
    assert info.nbytes == 35 * tensors[name].element_size()
    got = m.read(name)
    assert got.dtype == np.float32 and got.shape == (5, 7)
    with safe_open(str(path), framework="pt") as f:
        ref = f.get_tensor(name)
    assert ref.dtype == ALL_DTYPES[st_name]
    if st_name in ("I32", "I64", "U32", "U64"):
        # float32 cannot hold every int; compare against the same float32 conversion
        expect = ref.to(torch.float64).to(torch.float32).numpy()
    else:
        expect = ref.to(torch.float32).numpy()
    np.testing.assert_array_equal(got, expect)
    # the raw storage is bit-identical to the file
    raw = np.asarray(m.raw(name))
    ref_bits = ref.view(torch.uint8).numpy().tobytes() if ref.dtype != torch.bool else ref.numpy().tobytes()
    assert raw.tobytes() == ref_bits


def test_u64_values_beyond_int63(all_dtype_file):
    path, _ = all_dtype_file
    m = open_model(path)
    raw = np.asarray(m.raw("t_u64_big")).reshape(-1)
    assert raw.dtype == np.uint64
    assert raw.tolist() == [2**64 - 1, 2**63, 0, 1]


def test_single_file_catalog_and_metadata(make_safetensors):
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 16)).astype(np.float32)
    p = make_safetensors({"model.layers.3.self_attn.q_proj.weight": w,
                          "model.norm.weight": np.ones(16, np.float32)},
                         metadata={"format": "pt", "k": "v"})
    m = open_model(p)
    assert m.format == "safetensors"
    assert m.metadata == {"format": "pt", "k": "v"}
    assert len(m) == 2 and m.total_params == 8 * 16 + 16
    assert m.total_bytes == 4 * (8 * 16 + 16)
    info = m.info("model.layers.3.self_attn.q_proj.weight")
    assert (info.role, info.block, info.numel, info.matrix_shape) == ("attn_q", 3, 128, (8, 16))
    np.testing.assert_array_equal(m.read(info.name), w)
    with pytest.raises(WorkbenchError, match="no such tensor"):
        m.info("nope")


def _write_sharded(folder, tensors: dict, n_shards: int = 3, index=True):
    names = list(tensors)
    weight_map = {}
    for s in range(n_shards):
        part = {n: torch.from_numpy(tensors[n]) for n in names[s::n_shards]}
        fname = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(part, str(folder / fname))
        weight_map.update({n: fname for n in part})
    if index:
        (folder / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return weight_map


def test_sharded_via_index_and_folder(tmp_path):
    rng = np.random.default_rng(2)
    tensors = {f"model.layers.{i}.mlp.up_proj.weight": rng.standard_normal((4, 8)).astype(np.float32)
               for i in range(7)}
    wm = _write_sharded(tmp_path, tensors)
    (tmp_path / "config.json").write_text("{}")
    for target in (tmp_path / "model.safetensors.index.json", tmp_path):
        m = open_model(target)
        assert set(m.names()) == set(tensors)
        for n, arr in tensors.items():
            np.testing.assert_array_equal(m.read(n), arr)
            assert os.path.basename(m.info(n).file) == wm[n]


def test_hf_folder_without_index(tmp_path):
    rng = np.random.default_rng(3)
    tensors = {"a.weight": rng.standard_normal((3, 4)).astype(np.float32),
               "b.weight": rng.standard_normal((2, 4)).astype(np.float32)}
    _write_sharded(tmp_path, tensors, n_shards=2, index=False)
    m = open_model(tmp_path)
    for n, arr in tensors.items():
        np.testing.assert_array_equal(m.read(n), arr)


def test_sharded_missing_shard_named(tmp_path):
    tensors = {f"w{i}": np.ones((2, 2), np.float32) for i in range(4)}
    _write_sharded(tmp_path, tensors, n_shards=2)
    os.unlink(tmp_path / "model-00002-of-00002.safetensors")
    with pytest.raises(WorkbenchError) as ei:
        open_model(tmp_path / "model.safetensors.index.json")
    assert "model-00002-of-00002.safetensors" in str(ei.value)
    assert "not found" in str(ei.value)


@pytest.mark.parametrize("index_text", [
    "{not json", "[]", '{"weight_map": []}', '{"weight_map": {"a": 5}}', '{"nothing": 1}',
    '{"weight_map": {"a": "../x/\\u0000.safetensors"}}',
])
def test_malformed_index(tmp_path, index_text):
    p = tmp_path / "model.safetensors.index.json"
    p.write_text(index_text)
    with pytest.raises(WorkbenchError) as ei:
        open_model(p)
    assert str(p) in str(ei.value)
    assert "\n" not in str(ei.value)


def test_tensor_in_two_shards(tmp_path):
    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.ones(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(WorkbenchError, match="two shards"):
        open_model(tmp_path)


def _is_mapped(arr) -> bool:
    """True when the array's memory is a file mapping (np.memmap, mmap or a view of one)."""
    import mmap
    base = arr
    while base is not None:
        if isinstance(base, (np.memmap, mmap.mmap)):
            return True
        if isinstance(base, memoryview):
            return isinstance(base.obj, mmap.mmap)
        base = getattr(base, "base", None)
    return False


def test_open_is_lazy_and_fast(tmp_path, monkeypatch):
    """A 200 MB file opens in well under 0.5 s without reading its data."""
    p = tmp_path / "big.safetensors"
    n_tensors, rows, cols = 50, 1024, 1024  # 50 x 4 MiB = 200 MiB
    header = {}
    off = 0
    for i in range(n_tensors):
        header[f"model.layers.{i}.mlp.up_proj.weight"] = {
            "dtype": "F32", "shape": [rows, cols], "data_offsets": [off, off + rows * cols * 4]}
        off += rows * cols * 4
    blob = json.dumps(header).encode()
    blob += b" " * ((-len(blob)) % 8)
    with open(p, "wb") as fh:
        fh.write(len(blob).to_bytes(8, "little") + blob)
        fh.truncate(8 + len(blob) + off)  # sparse: zeros, no disk writes needed
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    m = open_model(p)  # speed is measured by `quant-workbench bench-load`, not here
    assert len(m) == n_tensors
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert (rss1 - rss0) * 1024 < 50 * 2**20
    # a tensor is read on demand with pread, never memory-mapped (a file truncated meanwhile
    # is an error, not a SIGBUS): whole up to PREAD_LIMIT, above it a Region whose rows are
    # read as they are sliced (streamed, never all resident)
    from workbench.formats.loaders import region
    monkeypatch.setattr(region, "PREAD_LIMIT", rows * cols * 4)
    raw = m.raw("model.layers.7.mlp.up_proj.weight")
    assert isinstance(raw, np.ndarray) and not _is_mapped(raw) and not raw.flags.writeable
    assert raw.shape == (rows, cols)
    monkeypatch.setattr(region, "PREAD_LIMIT", rows * cols * 4 - 1)
    raw = m.raw("model.layers.7.mlp.up_proj.weight")
    assert isinstance(raw, region.Region) and raw.shape == (rows, cols)
    rows_read = raw[10:20]
    assert isinstance(rows_read, np.ndarray) and rows_read.shape == (10, cols)
    assert not _is_mapped(rows_read)


def test_open_reads_only_the_header(tmp_path, monkeypatch, make_safetensors):
    """Opening must not read tensor bytes: count the bytes read through os.pread/open."""
    p = make_safetensors({"w": np.arange(1 << 20, dtype=np.float32).reshape(1024, 1024)})
    size = p.stat().st_size
    read_bytes = {"n": 0}
    real_pread = os.pread

    def counting_pread(fd, n, off):
        b = real_pread(fd, n, off)
        read_bytes["n"] += len(b)
        return b

    monkeypatch.setattr(os, "pread", counting_pread)
    import builtins
    real_open = builtins.open

    def guarded_open(file, mode="r", *a, **k):
        if str(file) == str(p) and "r" in mode:
            raise AssertionError("open_model read the file with open()")
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, "open", guarded_open)
    m = open_model(p)
    assert read_bytes["n"] < 1024 < size
    assert m.info("w").shape == (1024, 1024)
