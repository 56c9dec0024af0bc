"""`python -m workbench.bench.warm` compiles the kernels a scheme needs ahead of use (.ci/setup runs it)."""

import subprocess
import sys

from kernels import kquant_affine, kquant_sym
from workbench.bench import warm


def test_warm_names_compiles_the_searched_k_quant_kernels_plain_and_weighted():
    done = warm.warm_names(["q4_k", "q6_k"])
    assert done == ["q4_k", "q6_k"]
    # the plain and the importance-weighted searches each left a compiled signature
    assert len(kquant_affine.affine_k_encode.signatures) >= 1
    assert len(kquant_sym.sym_k_encode.signatures) >= 1


def test_each_process_starts_quick_then_heavy():
    """A float cast first in each process (its "ready" line within seconds), then the heavy
    kernels spread over the processes."""
    names = ["int8-channel", "q4_0", "q3_k", "fp16", "q4_k", "iq4_nl", "bf16"]
    order = warm._order(names)
    assert order[:5] == ["fp16", "bf16", "q4_k", "q3_k", "iq4_nl"]
    assert sorted(order) == sorted(names)
    shares = [order[i::2] for i in range(2)]
    assert shares[0][:2] == ["fp16", "q4_k"] and shares[1][:2] == ["bf16", "q3_k"]


def test_warm_methods_compiles_the_weighted_search():
    from kernels import weighted_search
    warm.warm_methods()
    assert len(weighted_search._candidate_errors.signatures) >= 1


def test_warm_command_runs_its_workers_and_reports(tmp_path):
    r = subprocess.run([sys.executable, "-m", "workbench.bench.warm", "--only", "q8_0,int4-g128"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "workbench.bench.warm", "--only", "no-such-scheme"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode != 0 and "no-such-scheme" in r.stderr


def test_accel_warmup_runs_every_ggml_type_not_only_the_first():
    from kernels import cpu_ops, ggml_legacy_quant, iq4nl_quant
    from workbench.quant import accel
    calls = []
    real = cpu_ops._quantize

    def spy(spec, *a, **k):
        calls.append(spec.ggml_name)
        return real(spec, *a, **k)
    cpu_ops._quantize = spy
    try:
        accel.warmup(["q8_0", "q5_1", "iq4_nl"], backend="cpu")
    finally:
        cpu_ops._quantize = real
    assert {"Q8_0", "Q5_1", "IQ4_NL"} <= set(calls)
    assert ggml_legacy_quant.legacy_encode.signatures and iq4nl_quant.iq4nl_encode.signatures


def test_every_kernel_takes_its_inputs_read_only_and_compiles_once():
    """numba compiles a kernel once per argument type, and a read-only array is a type of its
    own: weights from a file are read-only maps, those made in memory writable. Every input
    goes in read-only (kernels.host.readonly), so the warm-up compiles one variant and neither
    kind of array compiles anything more afterwards (a first edit on MiniLM had waited ~90 ms
    for a read-only variant; a K-quant encoder's second variant took minutes). In a fresh
    process, so that no other test has compiled a variant already."""
    code = (
        "import json\n"
        "import numpy as np\n"
        "from kernels import cpu_affine_dequant, cpu_affine_fused, cpu_ggml\n"
        "from workbench.quant import accel\n"
        "from workbench.schemes import get_scheme\n"
        "accel.warmup(['int4-g128', 'q4_0'], backend='cpu')\n"
        "ks = (cpu_affine_fused.quant_error_fused, cpu_affine_fused.quant_fused,\n"
        "      cpu_affine_dequant.affine_error, cpu_ggml.ggml_encode, cpu_ggml.ggml_error)\n"
        "before = [len(k.signatures) for k in ks]\n"
        "w = np.random.default_rng(1).standard_normal((64, 512)).astype(np.float32)\n"
        "for ro in (False, True):\n"
        "    w.setflags(write=not ro)\n"
        "    for n in ('int4-g128', 'q4_0'):\n"
        "        qt = accel.quantize(get_scheme(n), w, backend='cpu')\n"
        "        accel.dequant_error(w, qt, backend='cpu')\n"
        "        accel.quantize_error(get_scheme(n), w, backend='cpu')\n"
        "def readonly(kernel):\n"
        "    return sorted({not next(t for t in sig if getattr(t, 'ndim', 0) == 2 and\n"
        "                            str(getattr(t, 'dtype', '')) == 'float32').mutable\n"
        "                   for sig in kernel.signatures})\n"
        "print(json.dumps([before, [len(k.signatures) for k in ks], [readonly(k) for k in ks]]))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    import json
    before, after, kinds = json.loads(r.stdout.strip().splitlines()[-1])
    assert before == [1] * 5 and after == before
    assert kinds == [[True]] * 5


def test_the_header_says_how_long_the_warm_up_takes(monkeypatch, capsys):
    """The set-up's long step says up front how long it takes (its CPU cost over the cores it
    gets), before any kernel compiles."""
    class Done:
        def __init__(self, argv, *a, **k):
            self.argv = argv

        def wait(self):
            return 0
    monkeypatch.setattr(warm.subprocess, "Popen", Done)
    monkeypatch.setattr(warm.os, "cpu_count", lambda: 2)
    assert warm.main(["--jobs", "2"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert f"about {round(warm.WARM_CPU_S / 2 / 60)} min on an idle machine" in head, head
    monkeypatch.setattr(warm.os, "cpu_count", lambda: 1)
    assert warm.main(["--jobs", "2"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert f"about {round(warm.WARM_CPU_S / 60)} min" in head, head
