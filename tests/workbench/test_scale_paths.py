"""The fast paths behind issue 20's class 8 (a 300,000-tensor header, a 100,000-rule plan) give
the same results and the same errors as the general paths they shortcut."""

from __future__ import annotations

import json
import random
import re
import time

import pytest

from workbench.formats import catalog
from workbench.core import limits, patterns
from workbench.core.errors import WorkbenchError
from workbench.formats.loaders import safetensors_format as sf


def _file(header: dict | str, data: bytes = b"", **dumps) -> bytes:
    text = header if isinstance(header, str) else json.dumps(header, ensure_ascii=False, **dumps)
    blob = text.encode("utf-8", "surrogatepass")
    return len(blob).to_bytes(8, "little") + blob + data


def _both(buf: bytes):
    """(fast path's result or error, JSON path's result or error)."""
    out = []
    for fast in (True, False):
        saved = sf._canonical_header
        if not fast:
            sf._canonical_header = lambda *a: None
        try:
            out.append(sf.parse_header(buf, len(buf), "m.safetensors"))
        except WorkbenchError as exc:
            out.append(("error", str(exc)))
        finally:
            sf._canonical_header = saved
    return out


def _entries(n: int, meta: dict | None = None, meta_last: bool = False) -> dict:
    h = {}
    if meta is not None and not meta_last:
        h["__metadata__"] = meta
    off = 0
    for i in range(n):
        shape = [[2, 3], [0, 4], [5], [], [1, 2, 2]][i % 5]
        size = 4
        for d in shape:
            size *= d
        h[f"model.layers.{i}.w{i} é"] = {"dtype": "F32", "shape": shape,
                                         "data_offsets": [off, off + size]}
        off += size
    if meta is not None and meta_last:
        h["__metadata__"] = meta
    return h, off


@pytest.mark.parametrize("layout", [
    dict(), dict(separators=(",", ":")), dict(sort_keys=True), dict(indent=2),
    dict(separators=(",", ":"), sort_keys=True)])
@pytest.mark.parametrize("meta", [None, {"format": "pt", "note": "a,b:c}"}, {}])
def test_canonical_headers_read_as_json_does(layout, meta):
    h, size = _entries(12, meta=meta, meta_last=layout.get("sort_keys", False))
    buf = _file(h, b"\0" * size, **layout)
    fast, slow = _both(buf)
    assert fast == slow
    n = int.from_bytes(buf[:8], "little")
    took = sf._canonical_header(buf[8:8 + n], len(buf) - 8 - n, "m")
    # a metadata value holding '}' leaves the fast layout (its object must be flat text)
    if not (meta and "}" in meta.get("note", "")):
        assert took is not None, "a writer's layout should take the fast path"
        assert took[0] == slow[0] and took[1] == slow[1]


@pytest.mark.parametrize("text, data", [
    ('{"a":{"dtype":"F99","shape":[1],"data_offsets":[0,4]}}', 4),               # dtype
    ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', 4),               # size
    ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', 4),               # past the end
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
     '"b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}}', 8),                # overlap
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
     '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', 8),                # duplicate
    ('{"__metadata__":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4),    # metadata?
    ('{"__metadata__":{"a":"b"},"__metadata__":{"c":"d"}}', 0),                  # twice
    ('{"__metadata__":{"a":"b","a":"c"}}', 0),                                   # key twice
    ('{"__metadata__":{"a":[1]}}', 0),                                           # nested
    ('{"__metadata__":{oops}}', 0),                                              # not JSON
    ('{"a":{"dtype":"F32","shape":[01],"data_offsets":[0,4]}}', 4),              # leading 0
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,' + "4" * 41 + ']}}', 4),  # digits
    ('{"a\x01":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4),           # control
    ('{"a\\u00e9":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4),        # escape
    ('{"a\\udc80":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', 4),        # surrogate
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},}', 4),              # comma
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}', 4),         # extra key
    ('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}} x', 4),             # trailing
    ('{}', 0), ('[]', 0), ('{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}', 4),
])
def test_unusual_headers_end_as_the_json_path_ends(text, data):
    buf = _file(text, b"\0" * data)
    fast, slow = _both(buf)
    assert fast == slow


def test_fast_header_on_many_random_headers():
    r = random.Random(20)
    for _ in range(200):
        n = r.randrange(0, 30)
        h, size = _entries(n, meta={"k": "v"} if r.random() < 0.5 else None)
        buf = bytearray(_file(h, b"\0" * size, separators=r.choice([(",", ":"), (", ", ": ")])))
        if r.random() < 0.5 and len(buf) > 9:   # damage one byte of the header
            i = r.randrange(8, 8 + int.from_bytes(buf[:8], "little"))
            buf[i] = r.choice(b'{}[]":,0123456789 aF\\')
        fast, slow = _both(bytes(buf))
        assert fast == slow, bytes(buf)[:200]


def test_role_memo_gives_the_direct_classification():
    parts = ["model", "layers", "h", "blk", "mlp", "fc1", "fc2", "fc12", "FC1", "w1", "W2", "w3",
             "w12", "dense_h_to_4h", "dense_4h_to_h", "dense_14h_to_h", "ln_1", "ln_12", "ln",
             "ln1", "q_proj", "experts", "3", "17", "0", "weight", "bias", "gate", "up_proj",
             "down_proj", "attn_q", "output", "norm", "embed_tokens", "conv", "shared_experts",
             "c_fc", "t5", "Ln_2", "x12h", "4H", "é1", "\udc80", "İ", "ffn_up_exps"]
    r = random.Random(7)
    names = [".".join(r.choice(parts) for _ in range(r.randint(1, 6))) for _ in range(20000)]
    catalog._ROLE_MEMO.clear()
    catalog._MEMO.clear()
    for n in names:
        for nd in (1, 2, 3):
            assert catalog.infer_role(n, nd) == catalog._infer_role(n, nd), (n, nd)
        assert catalog.projection(n) == catalog._projection(n), n
    # numbered names share a template: 300,000 of them leave a few memo entries
    catalog._ROLE_MEMO.clear()
    for i in range(3000):
        catalog.infer_role(f"model.layers.{i}.t{i}", 2)
    assert len(catalog._ROLE_MEMO) < 40


@pytest.mark.parametrize("text, dup", [
    ('{"a":1,"a":2}', "a"), ('{"x":[{"k":"a:b","k":3}]}', "k"),
    ('{"a\\":":1,"b":{"c":"\\\\","c":1}}', "c"), ('{"a\\"b":1, "a\\"b":2}', 'a"b'),
    ('{"é:":1,"é:":2}', "é:"), ('[{"q":{"z":1,"z":1}}]', "z")])
def test_loads_finds_a_duplicate_key_anywhere(text, dup):
    with pytest.raises(WorkbenchError, match="duplicate key") as e:
        limits.loads(text, "f.json")
    assert repr(dup) in str(e.value)


@pytest.mark.parametrize("text", ['{"a":"x:y","b":[1,2,{"c":":"}]}', '{"a\\\\":{"b:":"\\""}}',
                                  '[1,2,3]', '{}', '"s:"', '{"a":{"a":{"a":1}}}'])
def test_loads_keeps_documents_without_duplicates(text):
    assert limits.loads(text, "f.json") == json.loads(text)


def test_pattern_sets_keep_the_first_match_across_chunks(monkeypatch):
    monkeypatch.setattr(patterns, "SET_CHUNK", 3)
    r = random.Random(3)
    atoms = ["a", "b", "ab", "^a", "b$", "a.b", "[ab]x", "x", "ba+", "^$", "q"]
    pats = [r.choice(atoms) for _ in range(40)]
    ps = patterns.PatternSet(pats)
    assert len(ps._sets) > 3
    for _ in range(500):
        name = "".join(r.choice("abxq") for _ in range(r.randint(0, 6)))
        want = next((i for i, p in enumerate(pats) if re.search(p, name)), None)
        assert ps.first(name) == want, (name, pats)


def test_pattern_sets_name_a_bad_pattern_in_a_later_chunk(monkeypatch):
    monkeypatch.setattr(patterns, "SET_CHUNK", 4)
    with pytest.raises(WorkbenchError, match=r"bad regular expression '\(x'"):
        patterns.PatternSet([f"a{i}" for i in range(10)] + ["(x"])


def test_pattern_sets_merge_after_many_names_and_keep_answers(monkeypatch):
    monkeypatch.setattr(patterns, "SET_CHUNK", 2)
    monkeypatch.setattr(patterns, "SET_CHUNK_MANY", 5)
    monkeypatch.setattr(patterns, "MERGE_AFTER", 50)
    r = random.Random(5)
    atoms = ["a", "b", "ab", "^a", "b$", "a.b", "[ab]x", "x", "ba+", "q", "xx"]
    pats = [r.choice(atoms) + r.choice(["", "b", "x"]) for _ in range(30)]
    ps = patterns.PatternSet(pats)
    small = len(ps._sets)
    for k in range(200):
        name = "".join(r.choice("abxq") for _ in range(r.randint(0, 6)))
        want = next((i for i, p in enumerate(pats) if re.search(p, name)), None)
        assert ps.first(name) == want, (name, k)
    assert len(ps._sets) < small    # merged into fewer, larger sets after 50 names


def _header(n: int) -> bytes:
    h = {f"t{i}": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]} for i in range(n)}
    b = json.dumps(h).encode()
    return len(b).to_bytes(8, "little") + b


def _cpu(fn, repeat=3) -> float:
    """Best CPU time of `repeat` runs, with the cyclic garbage collector off: its full
    collections cost in proportion to everything the test session holds, not to `fn`'s work
    (in a full pytest run they made a linear parse look 12x slower at 4x the size)."""
    import gc
    best = float("inf")
    gc.collect()
    gc.disable()
    try:
        for _ in range(repeat):
            t0 = time.process_time()
            fn()
            best = min(best, time.process_time() - t0)
    finally:
        gc.enable()
    return best


def test_header_parse_is_linear():
    """4x the tensors costs about 4x (quadratic would be 16x): generous bound 8x."""
    from workbench.formats.loaders.safetensors_format import parse_header
    small, big = _header(10_000), _header(40_000)
    t1 = _cpu(lambda: parse_header(small, len(small), "s"))
    t4 = _cpu(lambda: parse_header(big, len(big), "b"))
    assert t4 < 8 * t1 + 0.05, (t1, t4)


def test_plan_rules_resolve_in_one_pass():
    """Resolving names costs one RE2 set match each whatever the number of rules."""
    from workbench.quant.plan import Plan

    def plan(n):
        return Plan.from_dict({"format": "quant-workbench-plan", "version": 1, "default": "q8_0",
                               "rules": [{"match": f"re:layers\\.{i}\\.mlp", "scheme": "q4_0"}
                                         for i in range(n)]})
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(0, 2000, 7)]
    p1, p4 = plan(2_000), plan(8_000)
    assert p4.rule_for("model.layers.7999.mlp.x").match == "re:layers\\.7999\\.mlp"
    assert p4.rule_for("model.layers.1.mlp.x").match == "re:layers\\.1\\.mlp"   # first wins
    assert p4.rule_for("nothing") is None
    t1 = _cpu(lambda: [p1.rule_for(n) for n in names])
    t4 = _cpu(lambda: [p4.rule_for(n) for n in names])
    assert t4 < 3 * t1 + 0.05, (t1, t4)


def test_bad_pattern_among_many_names_its_rule(tmp_path):
    rules = [{"match": f"re:a{i}", "scheme": "q4_0"} for i in range(50)]
    rules.insert(20, {"match": "re:(x", "scheme": "q4_0"})
    p = tmp_path / "p.json"
    p.write_text(json.dumps({"format": "quant-workbench-plan", "version": 1, "default": "q8_0",
                             "rules": rules}))
    from workbench.quant.plan import Plan
    with pytest.raises(WorkbenchError, match=r"rule 're:\(x'") as e:
        Plan.load(p)
    assert str(p) in str(e.value)
