"""Hypothesis fuzz of the safetensors header parser: valid entries within the file, or WorkbenchError."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings, strategies as st

from workbench.formats.dtypes import STORAGE
from workbench.core.errors import WorkbenchError
from workbench.formats.loaders.safetensors_format import parse_header

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _check(buf: bytes, file_size: int) -> None:
    try:
        entries, metadata, data_start = parse_header(buf, file_size, "fuzz.safetensors")
    except WorkbenchError as exc:
        msg = str(exc)
        assert msg.startswith("fuzz.safetensors: ")
        assert "\n" not in msg
        return
    n = int.from_bytes(buf[:8], "little")
    assert data_start == 8 + n <= file_size
    data_size = file_size - data_start
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    spans = []
    for name, (dtype, shape, begin, end) in entries.items():
        assert isinstance(name, str) and name != "__metadata__"
        assert dtype in STORAGE
        assert all(isinstance(s, int) and s >= 0 for s in shape)
        assert 0 <= begin <= end <= data_size
        assert end - begin == math.prod(shape) * STORAGE[dtype][1]
        if end > begin:
            spans.append((begin, end))
    spans.sort()
    for (b0, e0), (b1, e1) in zip(spans, spans[1:]):
        assert b1 >= e0


def _wrap(header_bytes: bytes, extra: int) -> tuple[bytes, int]:
    buf = len(header_bytes).to_bytes(8, "little") + header_bytes
    return buf, len(buf) + extra


@SETTINGS
@given(st.binary(max_size=300), st.integers(0, 1 << 40))
def test_random_bytes(data, file_size):
    _check(data, file_size)


@SETTINGS
@given(st.binary(max_size=300), st.integers(0, 4096))
def test_random_bytes_with_consistent_length(body, extra):
    _check(*_wrap(body, extra))


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                         st.floats(allow_nan=False), st.text(max_size=8))
json_values = st.recursive(json_scalars, lambda c: st.one_of(
    st.lists(c, max_size=4), st.dictionaries(st.text(max_size=6), c, max_size=4)), max_leaves=12)
dtypes = st.one_of(st.sampled_from(sorted(STORAGE)), st.sampled_from(["F4", "C64", "Q4_K", ""]),
                   json_values)


@st.composite
def entry(draw):
    shape = draw(st.one_of(st.lists(st.integers(-2, 6), max_size=3), json_values))
    begin = draw(st.integers(-8, 600))
    size = draw(st.integers(-8, 600))
    offs = draw(st.one_of(st.just([begin, begin + size]), json_values))
    e = {"dtype": draw(dtypes), "shape": shape, "data_offsets": offs}
    for k in draw(st.lists(st.sampled_from(["dtype", "shape", "data_offsets"]), max_size=1)):
        del e[k]
    return e


headers = st.dictionaries(st.text(max_size=10), st.one_of(entry(), json_values), max_size=5)


@SETTINGS
@given(headers, st.one_of(st.none(), json_values), st.integers(0, 700))
def test_random_json_headers(header, meta, extra):
    h = dict(header)
    if meta is not None:
        h["__metadata__"] = meta
    _check(*_wrap(json.dumps(h).encode(), extra))


@st.composite
def valid_header(draw):
    """A consistent header (possibly with gaps), plus the data size it needs."""
    header, off = {}, 0
    for i in range(draw(st.integers(0, 5))):
        dtype = draw(st.sampled_from(sorted(STORAGE)))
        shape = draw(st.lists(st.integers(0, 5), max_size=3))
        off += draw(st.integers(0, 3))
        size = math.prod(shape) * STORAGE[dtype][1]
        header[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + size]}
        off += size
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5),
                                                      max_size=3))
    return header, off


@SETTINGS
@given(valid_header(), st.integers(0, 16))
def test_valid_headers_parse(hdr, extra):
    header, need = hdr
    buf, size = _wrap(json.dumps(header).encode(), need + extra)
    entries, meta, start = parse_header(buf, size, "ok.safetensors")
    assert set(entries) == set(header) - {"__metadata__"}
    for name, (dtype, shape, b, e) in entries.items():
        assert [b, e] == header[name]["data_offsets"] and list(shape) == header[name]["shape"]
    _check(buf, size)


@SETTINGS
@given(valid_header(), st.data())
def test_mutated_valid_headers(hdr, data):
    header, need = hdr
    raw = bytearray(json.dumps(header).encode())
    buf, size = _wrap(bytes(raw), need)
    buf = bytearray(buf)
    for _ in range(data.draw(st.integers(1, 6))):
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "size", "len"]))
        if op == "flip" and buf:
            i = data.draw(st.integers(0, len(buf) - 1))
            buf[i] = data.draw(st.integers(0, 255))
        elif op == "insert":
            i = data.draw(st.integers(0, len(buf)))
            buf[i:i] = data.draw(st.binary(min_size=1, max_size=4))
        elif op == "delete" and buf:
            i = data.draw(st.integers(0, len(buf) - 1))
            del buf[i:i + data.draw(st.integers(1, 4))]
        elif op == "size":
            size = max(0, size + data.draw(st.integers(-64, 64)))
        elif op == "len" and len(buf) >= 8:
            n = max(0, int.from_bytes(buf[:8], "little") + data.draw(st.integers(-8, 8)))
            buf[:8] = n.to_bytes(8, "little")
    _check(bytes(buf), size)
