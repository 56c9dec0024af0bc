"""One source for each quantization type's facts: the scheme class. Every table other layers
keep (the llama.cpp fallbacks and types, the tensor-type names and blocks, the weighted
encoders, the kernel specs) is the registry's own object, agrees with the classes and with
gguf-py's GGML_QUANT_SIZES, and a type added in its own module appears in all of them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import gguf
import numpy as np
import pytest

from kernels import cpu_ops
from kernels.spec import GGML_DECODERS
from workbench.core.errors import WorkbenchError
from workbench.quant.accel import spec_for
from workbench.schemes import get_scheme, list_schemes, registry
from workbench.schemes.ggml import GGMLScheme

GGML = dict(registry.ggml_schemes())


def test_every_ggml_class_is_registered_and_nothing_else_is_called_ggml():
    assert len(GGML) >= 23
    assert list(GGML) == [n for n in list_schemes() if isinstance(get_scheme(n), GGMLScheme)]
    from workbench.schemes.ggml import GGML_SCHEMES
    assert GGML_SCHEMES == tuple(GGML)


@pytest.mark.parametrize("name", sorted(GGML))
def test_a_type_agrees_with_gguf(name):
    s = GGML[name]
    qtype = gguf.GGMLQuantizationType(s.ggml_type)
    qk, size = gguf.GGML_QUANT_SIZES[qtype]
    assert (s.block_size, s.type_size, s.block_dtype.itemsize) == (qk, size, size)
    assert name == qtype.name.lower() and s.ggml_name == qtype.name
    assert s.llama_type.lower() == name and s.llama_type == (
        qtype.name.lower()[:-2] + "_K" if name.endswith("_k") else name)
    assert s.nbytes((3, 4 * qk)) == 3 * 4 * size
    assert s.bits_per_weight() == 8.0 * size / qk
    # the kernels are keyed by GGML's own number, passed down in the layout
    spec = spec_for(s)
    assert int(qtype) in GGML_DECODERS
    assert (spec.ggml_id, spec.qk, spec.bpb, spec.ggml_name) == (int(qtype), qk, size, qtype.name)
    assert spec.kernel == (s.quant_kernel or "")
    if s.quant_kernel:
        assert s.quant_kernel in cpu_ops.GGML_ENCODERS and spec.quant == "ggml"
    if s.weighted_encoder:
        from workbench.quant.methods.ggml_weighted import ENCODERS
        assert s.weighted_encoder[0] in ENCODERS
    if s.llama_fallback:   # llama.cpp falls back to a 32-weight type that it can write
        fb = GGML[s.llama_fallback]
        assert fb.block_size == 32 and fb.llama_fallback is None and fb.block_size < qk


def test_the_tables_are_the_registry_objects():
    from workbench.bench import warm
    from workbench.export import llama_tensor_types as ltt
    from workbench.planning import frontier
    from workbench.quant import runtimes
    from workbench.quant.methods import ggml_weighted
    assert runtimes.GGML_FALLBACK is registry.llama_fallbacks()
    assert runtimes.LLAMA_TYPES is registry.llama_schemes()
    assert runtimes.LOW_BIT_ONLY is registry.low_bit_only()
    assert ltt.GGML_TYPE_NAMES is registry.llama_type_names()
    assert ltt.BLOCK is registry.block_sizes()
    assert frontier.BLOCK is registry.block_sizes()
    assert frontier.FALLBACK is registry.llama_fallbacks()
    assert ggml_weighted.SUPPORTED is registry.weighted_types()
    from workbench.bench import ggml as bench_ggml, throughput
    from workbench.planning import conventions
    assert conventions.GGML_BLOCK is registry.block_sizes()
    assert bench_ggml.DEFAULT_TYPES is registry.ggml_by_number()
    assert throughput.GGML_ORDER == list(registry.ggml_by_number()) and \
        sorted(registry.ggml_by_number()) == sorted(GGML)
    assert not hasattr(warm, "_FAMILY_OF")
    import kernels.spec as kspec
    assert not hasattr(kspec, "GGML_TYPES")      # the kernels' own numbering is gone


def test_the_tables_say_what_the_classes_say():
    assert dict(registry.llama_fallbacks()) == {
        n: s.llama_fallback for n, s in GGML.items() if s.llama_fallback}
    assert dict(registry.block_sizes()) == {n: s.block_size for n, s in GGML.items()}
    assert registry.llama_schemes() == {"fp32", "fp16", "bf16"} | set(GGML)
    assert dict(registry.llama_type_names()) == {
        n: get_scheme(n).llama_type for n in list_schemes() if n in registry.llama_schemes()}
    assert dict(registry.low_bit_only()) == {
        n: s.bits_per_weight() for n, s in GGML.items() if s.low_bit_only}
    assert registry.weighted_types() == tuple(n for n, s in GGML.items() if s.weighted_encoder)
    # the figures llama.cpp's own tables give (llama-quant.cpp tensor_type_fallback)
    assert registry.llama_fallbacks()["q4_k"] == "q5_0"
    assert registry.llama_fallbacks()["q6_k"] == "q8_0"
    assert registry.llama_type_names()["q4_k"] == "q4_K"


def test_error_messages_list_the_types_from_the_registry():
    from workbench.quant.runtimes import get_runtime
    why = get_runtime("llama.cpp").unsupported("int4-g128")
    listed = why.split("(types: ")[1].rstrip(")").split()
    assert set(listed) == {"f32", "f16", "bf16"} | set(GGML)
    assert listed[:5] == ["f32", "f16", "bf16", "q4_0", "q4_1"]   # floats, then by type number


def test_a_new_type_in_its_own_module_reaches_every_table():
    """Adding a GGML type is one class: the tables, the candidates and the kernel spec follow
    (here a copy of Q8_0 under another name, registered before the registry is first read)."""
    code = textwrap.dedent("""
        from workbench.schemes.ggml.legacy import Q8_0
        class Q8Copy(Q8_0):
            name = "test_q8_copy"
            llama_fallback = "q8_0"
        from workbench.quant import runtimes
        from workbench.export import llama_tensor_types as ltt
        from workbench.planning import frontier
        from workbench.quant.accel import spec_for
        assert runtimes.GGML_FALLBACK["test_q8_copy"] == "q8_0"
        assert "test_q8_copy" in runtimes.LLAMA_TYPES
        assert "test_q8_copy" in runtimes.candidate_schemes("llama.cpp")
        assert ltt.GGML_TYPE_NAMES["test_q8_copy"] == "q8_0"
        assert ltt.BLOCK["test_q8_copy"] == frontier.BLOCK["test_q8_copy"] == 32
        assert "test_q8_copy" in runtimes.get_runtime("llama.cpp").unsupported("int4-g128")
        assert spec_for("test_q8_copy").ggml_id == 8
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_a_block_layout_that_disagrees_with_gguf_is_refused():
    from workbench.schemes.ggml.common import block_dtype as layout
    with pytest.raises(TypeError, match="GGML_QUANT_SIZES says 144 for Q4_K"):
        class Wrong(GGMLScheme, register=False):          # noqa: F841
            ggml_type = gguf.GGMLQuantizationType.Q4_K
            block_dtype = layout([("d", "<f2"), ("qs", "u1", (140,))], 142)


def test_a_failed_ggml_import_is_loud():
    """Without gguf-py the GGML schemes cannot load: an error naming the cause, not a registry
    that silently lacks every GGML type."""
    code = textwrap.dedent("""
        import sys
        sys.modules["gguf"] = None          # import gguf -> ImportError
        from workbench.schemes import list_schemes
        try:
            names = list_schemes()
        except ImportError as exc:
            print("refused:", exc)
        else:
            print("listed", len(names), "q4_k" in names)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert out.stdout.startswith("refused: the GGML schemes cannot be imported"), out
    assert "gguf" in out.stdout


def test_an_unknown_scheme_still_reads_as_a_workbench_error():
    with pytest.raises(WorkbenchError, match="unknown scheme 'q9_z'"):
        get_scheme("q9_z")
    assert np.isclose(get_scheme("q4_k").bits_per_weight(), 4.5)


def test_the_docs_table_lists_every_type_as_the_registry_does():
    """docs/schemes.md's GGML table (the one hand-written copy, for readers) agrees with the
    classes: one row per registered type, its GGUF type, weights, bytes and bits per block."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[2] / "docs" / "schemes.md").read_text()
    section = text.split("## GGML block formats", 1)[1].split("\n\n", 2)[1]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = cells[1:5]
    assert set(rows) == set(GGML)
    for name, (gtype, qk, size, bits) in rows.items():
        s = GGML[name]
        assert gtype.split()[0] == s.ggml_name, name
        assert "(type" not in gtype or gtype.endswith(f"(type {int(s.ggml_type)})"), name
        assert (int(qk), int(size), float(bits)) == (s.block_size, s.type_size,
                                                     s.bits_per_weight()), name
