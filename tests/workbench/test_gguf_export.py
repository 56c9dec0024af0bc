"""GGUF in and out: the loader's view of GGUF tensors, the `gguf` exporter (metadata copy,
per-plan re-encoding, exact bytes, file type, atomic writes) and the round trip
safetensors -> GGUF -> mixed plan -> GGUF -> reopen."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from workbench.core.errors import WorkbenchError
from workbench.export import export, get_exporter
from workbench.formats.loaders import open_model
from workbench.quant.plan import KEEP, Plan
from workbench.core.progress import run
from workbench.schemes import get_scheme

Q = gguf.GGMLQuantizationType


def expected_bytes(model, name: str, scheme: str) -> bytes:
    """What the exporter must write for `name`: the scheme's own bytes, or the source's."""
    if scheme == KEEP:
        return np.ascontiguousarray(model.raw(name)).tobytes()
    qt = get_scheme(scheme).quantize(model.read_matrix(name))
    return np.ascontiguousarray(next(iter(qt.arrays.values()))).tobytes()


def check_bytes(model, plan, path) -> dict[str, str]:
    from workbench.quant.runtimes import plan_decisions
    reader = gguf.GGUFReader(str(path))
    assignment = {n: d.applied for n, d in plan_decisions(model, plan, "llama.cpp").items()}
    assert [t.name for t in reader.tensors] == list(model.tensors)
    types = {}
    for t in reader.tensors:
        assert np.asarray(t.data).tobytes() == expected_bytes(model, t.name, assignment[t.name]), t.name
        types[t.name] = t.tensor_type.name
    return types


def field(reader, key):
    f = reader.fields[key]
    return f.contents()


MIXED = Plan(default="q4_k", rules=[
    {"match": "model.embed_tokens.weight", "scheme": "q8_0"},
    {"match": "re:v_proj\\.weight$", "scheme": "q6_k"},
    {"match": "re:k_proj\\.weight$", "scheme": "q2_k"},
    {"match": "re:o_proj\\.weight$", "scheme": "q3_k"},
    {"match": "re:layers\\.0\\.mlp", "scheme": "q5_k"},
    {"match": "re:layers\\.1\\.mlp\\.up", "scheme": "q4_0"},
    {"match": "re:layers\\.1\\.mlp\\.down", "scheme": "q5_1"},
    {"match": "re:layers\\.1\\.mlp\\.gate", "scheme": "iq4_nl"},
    {"match": "re:norm", "scheme": "fp32"},
    {"match": "lm_head.weight", "scheme": "bf16"},
])


def test_exporters_are_registered():
    assert get_exporter("gguf").suffix == ".gguf"
    assert get_exporter("llama-tensor-types").suffix == ".txt"


def test_safetensors_to_gguf_exact_bytes_and_metadata(tiny_llama, tmp_path):
    path, tensors = tiny_llama
    model = open_model(path)
    out = tmp_path / "mixed.gguf"
    events = []
    job = export(model, MIXED, "gguf", out)
    info = run(job, events.append)
    assert events and events[-1].fraction == 1.0
    types = check_bytes(model, MIXED, out)
    assert types["model.embed_tokens.weight"] == "Q8_0"
    assert types["model.layers.0.self_attn.v_proj.weight"] == "Q6_K"
    assert types["model.layers.1.mlp.gate_proj.weight"] == "IQ4_NL"
    assert types["model.layers.0.input_layernorm.weight"] == "F32"
    assert types["lm_head.weight"] == "BF16"
    assert types["model.layers.0.self_attn.q_proj.bias"] == "F32"        # 1-D: keep
    reader = gguf.GGUFReader(str(out))
    assert field(reader, "general.quantization_version") == 2
    assert info["file_type"] == gguf.LlamaFileType(field(reader, "general.file_type")).name
    assert json.loads(field(reader, "quant_workbench.plan")) == MIXED.to_dict()
    assert field(reader, "general.architecture") == "quant_workbench"
    assert not list(tmp_path.glob(".*.tmp"))


def test_file_type_is_the_type_of_most_weights(tiny_llama, tmp_path):
    model = open_model(tiny_llama[0])
    for scheme, ftype in [("q4_k", "MOSTLY_Q4_K_M"), ("q8_0", "MOSTLY_Q8_0"),
                          ("iq4_nl", "MOSTLY_IQ4_NL"), ("fp16", "MOSTLY_F16"),
                          ("q3_k", "MOSTLY_Q3_K_M"), ("q6_k", "MOSTLY_Q6_K")]:
        out = tmp_path / f"{scheme}.gguf"
        plan = Plan(default=scheme, rules=[{"match": "lm_head.weight", "scheme": "q8_0"}])
        info = run(export(model, plan, "gguf", out))
        reader = gguf.GGUFReader(str(out))
        assert gguf.LlamaFileType(field(reader, "general.file_type")).name == ftype == info["file_type"]


def test_loader_reports_pytorch_shapes_and_ggml_types(tiny_llama, tmp_path):
    model = open_model(tiny_llama[0])
    out = tmp_path / "m.gguf"
    run(export(model, MIXED, "gguf", out))
    g = open_model(out)
    assert g.format == "gguf" and g.source.tensors
    for name, info in model.tensors.items():
        gi = g.info(name)
        assert gi.shape == info.shape, name
    down = g.info("model.layers.0.mlp.down_proj.weight")
    assert down.shape == (256, 512) and down.dtype == "Q5_K"
    assert down.bits_per_weight == 5.5
    assert g.info("model.embed_tokens.weight").bits_per_weight == 8.5
    assert g.info("lm_head.weight").dtype == "BF16"
    # the GGUF stores ne innermost first
    rt = {t.name: t for t in g.source.tensors}
    assert [int(x) for x in rt["model.layers.0.mlp.down_proj.weight"].shape] == [512, 256]
    # data decodes to the scheme's own dequantization
    s = get_scheme("q5_k")
    w = model.read_matrix("model.layers.0.mlp.down_proj.weight")
    np.testing.assert_array_equal(g.read_matrix("model.layers.0.mlp.down_proj.weight"),
                                  s.dequantize(s.quantize(w)))
    assert g.total_bytes < model.total_bytes / 4


def test_round_trip_demo_model_mixed_plan(demo_model_path, tmp_path):
    """Open a GGUF made from the demo model, assign a mixed plan, export, reopen."""
    demo = open_model(demo_model_path)
    first = tmp_path / "demo.gguf"
    run(export(demo, Plan(default="q8_0"), "gguf", first))
    g = open_model(first)
    # the demo model folder has config.json and a tokenizer: a runnable GGUF, llama.cpp names
    assert "token_embd.weight" in g.tensors and "blk.0.attn_q.weight" in g.tensors
    plan2 = Plan(default="q4_k", rules=[
        {"match": "token_embd.weight", "scheme": "keep"},
        {"match": "re:attn_q\\.weight$", "scheme": "fp16"},
        {"match": "re:attn_k\\.weight$", "scheme": "bf16"},
        {"match": "re:ffn_down", "scheme": "q6_k"},
        {"match": "re:blk\\.1\\.", "scheme": "iq4_nl"},
        {"match": "re:attn_norm", "scheme": "fp32"},
    ])
    second = tmp_path / "demo-mixed.gguf"
    info = run(export(g, plan2, "gguf", second))
    types = check_bytes(g, plan2, second)
    assert types["token_embd.weight"] == "Q8_0"      # kept byte for byte
    assert set(types.values()) >= {"Q8_0", "F16", "BF16", "Q6_K", "IQ4_NL", "Q4_K", "F32"}
    g2 = open_model(second)
    assert sorted(i.shape for i in g2.tensors.values()) == sorted(
        i.shape for i in demo.tensors.values())
    # every key/value of the source is copied; only the ones the export sets may change
    changed = {"general.file_type", "quant_workbench.plan", "quant_workbench.source_format"}
    for k, v in g.metadata.items():
        assert k in g2.metadata, k
        if k not in changed:
            assert g2.metadata[k] == v, k
    assert g2.metadata["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_Q4_K_M)
    assert json.loads(g2.metadata["quant_workbench.plan"]) == plan2.to_dict()
    assert info["types"]["Q4_K"] > 0
    # the rule `re:blk\.1\.` -> iq4_nl also matches layer 1's norms: llama.cpp never
    # re-types them, so it is skipped (kept) with a note instead of written into a broken file
    assert types["blk.1.attn_norm.weight"] == "F32"   # the runnable export wrote norms as F32
    assert "rule ignored" in info["notes"]["blk.1.attn_norm.weight"]
    skipped = sorted(n for n, note in info["notes"].items() if "rule ignored" in note)
    assert skipped == sorted(n for n in g.tensors if n.startswith("blk.1.")
                             and g.info(n).ndim == 1)       # 2 norms + 3 biases
    assert info["fallbacks"]["tensors"]["skipped"] == len(skipped) == 5


def _llama_like_gguf(path, alignment=64):
    """A GGUF with every kind of key/value a llama.cpp model carries."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_custom_alignment(alignment)
    w.add_name("tiny llama")
    w.add_uint32("llama.block_count", 1)
    w.add_uint64("llama.context_length", 2 ** 40)
    w.add_float32("llama.rope.freq_base", 10000.5)
    w.add_uint32("llama.expert_count", 2)           # its blk.0.ffn_gate_exps holds 2 experts
    w.add_uint32("llama.expert_used_count", 1)      # (config_check holds the two together)
    w.add_float64("test.f64", 1.0 / 3.0)
    w.add_bool("test.flag", True)
    w.add_int8("test.i8", -5)
    w.add_int16("test.i16", -300)
    w.add_int64("test.i64", -2 ** 40)
    w.add_uint8("test.u8", 200)
    w.add_uint16("test.u16", 60000)
    w.add_int32("test.i32", -7)
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", ["<s>", "héllo", "▁wörld", "日本", "\u0120a"] * 30)
    w.add_array("tokenizer.ggml.scores", [0.5, -1.25, 3.0] * 50)
    w.add_key_value("tokenizer.ggml.token_type", [1, 2, 3] * 50, gguf.GGUFValueType.ARRAY,
                    sub_type=gguf.GGUFValueType.INT32)
    w.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    w.add_quantization_version(2)
    rng = np.random.default_rng(0)
    t = {"token_embd.weight": rng.standard_normal((16, 256)).astype(np.float16),
         "blk.0.attn_q.weight": rng.standard_normal((256, 256)).astype(np.float16),
         "blk.0.ffn_down.weight": gguf.quants.quantize(
             rng.standard_normal((256, 512)).astype(np.float32), Q.Q8_0),
         "blk.0.attn_norm.weight": np.ones(256, np.float32),
         "blk.0.ffn_gate_exps.weight": rng.standard_normal((2, 64, 256)).astype(np.float32)}
    for name, arr in t.items():
        if name == "blk.0.ffn_down.weight":
            w.add_tensor(name, arr, raw_dtype=Q.Q8_0)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return t


def test_metadata_copied_exactly_from_gguf(tmp_path):
    src = tmp_path / "llama.gguf"
    _llama_like_gguf(src)
    model = open_model(src)
    assert model.info("blk.0.ffn_gate_exps.weight").shape == (2, 64, 256)
    assert model.info("blk.0.ffn_down.weight").dtype == "Q8_0"
    plan = Plan(default="q4_k", rules=[{"match": "token_embd.weight", "scheme": "keep"},
                                       {"match": "blk.0.ffn_down.weight", "scheme": "q5_0"}])
    out = tmp_path / "out.gguf"
    run(export(model, plan, "gguf", out))
    r1, r2 = gguf.GGUFReader(str(src)), gguf.GGUFReader(str(out))
    rewritten = {"general.file_type", "GGUF.kv_count"}
    for key, f1 in r1.fields.items():
        if key in rewritten:
            continue
        f2 = r2.fields[key]
        assert f2.types == f1.types, key
        assert f2.contents() == f1.contents(), key
    assert r2.alignment == 64
    # ffn_down (256x512, Q5_0) holds more parameters than attn_q + the experts (Q4_K)
    assert field(r2, "general.file_type") == int(gguf.LlamaFileType.MOSTLY_Q5_0)
    check_bytes(model, plan, out)
    types = {t.name: t.tensor_type.name for t in r2.tensors}
    assert types == {"token_embd.weight": "F16", "blk.0.attn_q.weight": "Q4_K",
                     "blk.0.ffn_down.weight": "Q5_0", "blk.0.attn_norm.weight": "F32",
                     "blk.0.ffn_gate_exps.weight": "Q4_K"}
    # 3-D expert tensor: blocks along the innermost dimension, as ggml lays them out
    back = open_model(out).read("blk.0.ffn_gate_exps.weight")
    w = model.read("blk.0.ffn_gate_exps.weight")
    s = get_scheme("q4_k")
    np.testing.assert_array_equal(back, s.dequantize(s.quantize(w)))


def test_ineligible_tensor_is_refused_by_name_and_nothing_written(make_safetensors, tmp_path):
    p = make_safetensors({"a.weight": np.ones((4, 256), np.float32),
                          "b.weight": np.ones((4, 96), np.float32)})
    model = open_model(p)
    out = tmp_path / "x.gguf"
    # --strict: a fallback is an error naming the tensor, and nothing is written
    with pytest.raises(WorkbenchError, match="b.weight") as ei:
        run(export(model, Plan(default="q4_k"), "gguf", out, strict=True))
    assert "256" in str(ei.value) and "strict=True: " in str(ei.value)   # the API's terms
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))
    # without it, llama-quantize's fallback: Q4_K -> Q5_0 for rows of 96 = 3 x 32
    info = run(export(model, Plan(default="q4_k"), "gguf", out))
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors}
    assert types == {"a.weight": "Q4_K", "b.weight": "Q5_0"}
    assert info["fallbacks"]["fallbacks"] == {"q4_k->q5_0": 1}
    assert "b.weight" in info["notes"] and "q5_0 instead" in info["notes"]["b.weight"]
    # rows of 40: not a multiple of 32 either -> F16, as llama-quantize does
    p2 = make_safetensors({"c.weight": np.ones((4, 40), np.float32)}, name="c.safetensors")
    run(export(open_model(p2), Plan(default="q6_k"), "gguf", out))
    assert [t.tensor_type.name for t in gguf.GGUFReader(str(out)).tensors] == ["F16"]


def test_scheme_without_gguf_type_is_refused(make_safetensors, tmp_path):
    p = make_safetensors({"a.weight": np.ones((4, 256), np.float32)})
    model = open_model(p)
    with pytest.raises(WorkbenchError, match="llama.cpp has no tensor type for int4-g128"):
        run(export(model, Plan(default="int4-g128"), "gguf", tmp_path / "x.gguf"))


def test_cancel_leaves_existing_file_untouched(tiny_llama, tmp_path):
    model = open_model(tiny_llama[0])
    out = tmp_path / "keep.gguf"
    out.write_bytes(b"previous")
    job = export(model, Plan(default="q4_k"), "gguf", out)
    for _ in range(4):
        next(job)          # header written, some tensors in flight
    assert list(tmp_path.glob(".keep.gguf.*.tmp"))
    job.close()            # what the GUI's cancel does
    assert out.read_bytes() == b"previous"
    assert not list(tmp_path.glob(".*.tmp"))


def test_keep_widens_types_gguf_lacks(make_safetensors, tmp_path):
    import torch
    rng = np.random.default_rng(0)
    f8 = torch.from_numpy(rng.standard_normal((4, 32)).astype(np.float32)).to(torch.float8_e4m3fn)
    t = {"u8": np.arange(256, dtype=np.uint8).reshape(8, 32),
         "flag": np.array([[True, False] * 16]),
         "f16.weight": rng.standard_normal((4, 32)).astype(np.float16),
         "bf16.weight": torch.from_numpy(rng.standard_normal((4, 32)).astype(np.float32)).bfloat16(),
         "i64": np.arange(10, dtype=np.int64),
         "f8.weight": f8}
    model = open_model(make_safetensors(t))
    out = tmp_path / "w.gguf"
    run(export(model, Plan(default="keep"), "gguf", out))
    g = open_model(out)
    assert {n: i.dtype for n, i in g.tensors.items()} == {
        "u8": "I16", "flag": "I8", "f16.weight": "F16", "bf16.weight": "BF16", "i64": "I64",
        "f8.weight": "F16"}
    for n in t:
        np.testing.assert_array_equal(g.read_matrix(n), model.read_matrix(n), err_msg=n)


def test_cli_evaluate_q4_k_on_minilm_and_on_gguf(minilm_path, tiny_llama, tmp_path, capsys):
    from workbench.cli import main
    assert main(["evaluate", str(minilm_path), "--scheme", "q4_k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in out["tensors"]}
    ffn = rows["encoder.layer.0.output.dense.weight"]
    assert ffn["scheme"] == "q4_k" and ffn["bits_per_weight"] == 4.5
    assert ffn["rel_rmse"] < 0.0755
    assert "multiple of 256" in rows["encoder.layer.0.attention.self.query.weight"]["note"]
    g = tmp_path / "t.gguf"
    run(export(open_model(tiny_llama[0]), Plan(default="q8_0"), "gguf", g))
    assert main(["evaluate", str(g), "--scheme", "q4_k", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in out["tensors"]}
    assert rows["model.layers.0.mlp.up_proj.weight"]["scheme"] == "q4_k"
    assert rows["model.layers.0.mlp.up_proj.weight"]["bits_per_weight"] == 4.5


@pytest.mark.parametrize("dtype", [np.float16, np.float32, "bf16"])
def test_row_chunks_decoded_into_a_reused_buffer_keep_every_byte(make_safetensors, tmp_path,
                                                                  monkeypatch, dtype):
    """F16/BF16 row chunks are widened into one per-thread buffer that the next chunk
    overwrites, and each tensor is written part by part: every byte stays the scheme's own
    over several chunks and tensors on the worker threads (fp32 output of a buffer that is
    reused, q8_0 and fp16 between them)."""
    import torch

    from workbench.export import gguf_file, gguf_tensor_data
    monkeypatch.setattr(gguf_tensor_data, "CHUNK_ELEMENTS", 3 * 256)     # 3 rows a chunk
    # three worker threads whatever numba's thread count (one in a pytest-xdist worker)
    monkeypatch.setattr(gguf_file, "_workers", lambda: 3)
    rng = np.random.default_rng(5)
    t = {f"w{i}": rng.standard_normal((10 + i, 256)).astype(np.float32) for i in range(5)}
    if dtype == "bf16":
        t = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in t.items()}
    else:
        t = {k: v.astype(dtype) for k, v in t.items()}
    model = open_model(make_safetensors(t))
    plan = Plan(default="fp32", rules=[{"match": "w1", "scheme": "q8_0"},
                                       {"match": "w3", "scheme": "fp16"}])
    out = tmp_path / "chunks.gguf"
    run(export(model, plan, "gguf", out))
    types = check_bytes(model, plan, out)
    assert types == {"w0": "F32", "w1": "Q8_0", "w2": "F32", "w3": "F16", "w4": "F32"}
    reader = gguf.GGUFReader(str(out))
    w4 = [x for x in reader.tensors if x.name == "w4"][0]
    assert np.array_equal(np.asarray(w4.data).reshape(14, 256), model.read_matrix("w4"))


def test_zero_row_tensor_exported_to_gguf_evaluates(tmp_path, small_model):
    from workbench.cli import main
    src = small_model(tmp_path / "m", [("blk.0.attn_q.weight", (0, 32)),
                                  ("blk.0.ffn_up.weight", (4, 32))])
    out = tmp_path / "z.gguf"
    assert main(["export", str(src), "--scheme", "q8_0", "--format", "gguf", "-o", str(out)]) == 0
    from workbench.quant.evaluate import evaluate
    from workbench.formats.loaders import open_model
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    m = open_model(out)
    assert m.read_matrix("blk.0.attn_q.weight").shape == (0, 32)
    ev = run(evaluate(m, Plan(default="q4_0")))
    assert set(ev.tensors) == {"blk.0.attn_q.weight", "blk.0.ffn_up.weight"}


def test_lone_surrogate_name_is_a_clean_gguf_refusal(tmp_path, small_model, cli_main):
    src = small_model(tmp_path / "m", [("blk.0.attn_q.weight\udc80", (4, 32))])
    rc, err = cli_main("export", src, "--scheme", "q8_0", "--format", "gguf",
                       "-o", tmp_path / "o.gguf")
    assert rc == 2 and "lone surrogate" in err and err.count("\n") == 1
    rc, _ = cli_main("export", src, "--scheme", "q8_0", "--format", "safetensors",
                     "-o", tmp_path / "o.safetensors")
    assert rc == 0
    rc, _ = cli_main("inspect", tmp_path / "o.safetensors")
    assert rc == 0
