"""`python -m workbench.bench.warm` compiles the kernels a scheme needs ahead of use (.ci/setup runs it)."""

import subprocess
import sys

from kernels import kquant_affine, kquant_sym
from workbench.bench import warm


def test_warm_names_compiles_the_searched_k_quant_kernels_plain_and_weighted():
    done = warm.warm_names(["q4_k", "q6_k"])
    assert done == ["q4_k", "q6_k"]
    # the plain and the importance-weighted searches each left a compiled signature
    assert len(kquant_affine.q45k_encode.signatures) >= 1        # Q4_K/Q5_K (Q2_K: q2k_encode)
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
        "      cpu_affine_dequant.affine_rows, cpu_ggml.ggml_encode, cpu_ggml.ggml_rows)\n"
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


class _FakeWorker:
    """A worker process that reports its share ready at once (nothing compiles)."""

    def __init__(self, argv, *a, **k):
        import io
        share = argv[argv.index("--only") + 1].split(",")
        tag = argv[argv.index("--tag") + 1]
        self.stdout = io.StringIO("".join(
            "  kernels: statistics, F16/BF16 widening and the weighted scale search ready "
            f"({tag}, 0 s, 1 CPU s)\n" if n == warm.STATS
            else f"  kernels: {n} ready ({tag}, 0 s, 1 CPU s)\n"
            for n in share))

    def wait(self):
        return 0


def test_the_header_says_how_long_the_warm_up_takes(monkeypatch, capsys):
    """The set-up's long step says up front how long it takes (its CPU cost over the cores it
    gets), before any kernel compiles."""
    monkeypatch.setattr(warm.subprocess, "Popen", _FakeWorker)
    monkeypatch.setattr(warm.os, "cpu_count", lambda: 2)
    assert warm.main(["--jobs", "2"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert f"about {round(warm.FIRST_CPU_S / 2)} s for those" in head, head
    assert f"{round(warm.WARM_CPU_S / 2 / 60)} min for all on an idle machine" in head, head
    monkeypatch.setattr(warm.os, "cpu_count", lambda: 1)
    assert warm.main(["--jobs", "2"]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert f"about {round(warm.FIRST_CPU_S)} s for those" in head, head


def test_first_stage_is_what_the_demo_and_minilm_use():
    """The default plan's scheme, the sensitivity/app schemes and allocate's default
    candidates at 4+ bits/weight; not the lattice i-quants (cut from those candidates)."""
    from workbench.api import DEFAULT_SCHEMES
    from workbench.quant.plan import Plan
    from workbench.schemes import list_schemes
    first = warm.first_stage()
    assert first[0] == Plan().default == "int8-channel"
    assert set(DEFAULT_SCHEMES.split(",")) <= set(first)
    assert {"q4_k", "iq4_nl", "int4-g128", "fp8-e4m3", "fp16"} <= set(first)
    assert not {"iq2_xxs", "iq3_s", "nf4-g64", "ternary-g64"} & set(first)
    assert set(first) <= set(list_schemes())


def test_shares_put_the_first_stage_ahead_and_a_float_cast_first(monkeypatch):
    first = ["int8-channel", "q4_k", "q3_k", "q4_0", "fp16", "bf16", warm.STATS]
    rest = ["iq2_xxs", "nf4-g64", "int3-g64"]
    shares = warm._shares([first, rest], 2)
    assert [s[0][0] for s in shares] == ["fp16", "bf16"]       # a "ready" line at once each
    got = [n for s in shares for k in s for n in k]
    assert sorted(got) == sorted(first + rest)
    # the two costliest families (Q3_K's and Q4_K's searches) go to different processes, and
    # the next (the packed codes) to the one whose first is the cheaper; each process's first
    # stage before its second
    assert warm.FAMILY_CPU_S["q3_k"] > warm.FAMILY_CPU_S["q4_k"] > warm.FAMILY_CPU_S["int8-channel"]
    q3k = next(s for s in shares if "q3_k" in s[0])
    q4k = next(s for s in shares if "q4_k" in s[0])
    assert q3k is not q4k and "int8-channel" in q4k[0], shares
    assert all(s[0][0] in warm.QUICK for s in shares)


def test_the_ready_line_comes_once_the_first_stage_is_done(monkeypatch, capsys):
    monkeypatch.setattr(warm.subprocess, "Popen", _FakeWorker)
    assert warm.main(["--jobs", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(warm.first_stage())
    at = [i for i, line in enumerate(out) if "kernels: ready for the demo and MiniLM" in line]
    assert len(at) == 1 and f"({n} schemes)" in out[at[0]], out
    assert "(2 CPU s in the workers)" in out[at[0]], out[at[0]]     # 1 CPU s from each
    before = " ".join(out[:at[0]])
    assert all(f"kernels: {s} ready" in before for s in warm.first_stage())
    assert "statistics" in before
    assert "kernels: iq2_xxs ready" in " ".join(out)        # then the rest
    assert out[-1].startswith("kernels compiled or loaded for")
