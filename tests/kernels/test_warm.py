"""`python -m workbench.bench.warm` compiles the kernels a scheme needs ahead of use (.ci/setup runs it)."""

import json
import re
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


def test_tasks_compile_each_kernel_once():
    """The GGML decoders are one task; each GGML family's encoders another, its schemes
    finished after both; Q2_K's encoder waits for Q4_K's (shared helpers); a later stage's
    family waits for its earlier task; only the listed encoder families may go to -O2."""
    first = ["int8-channel", "int4-g128", "q4_k", "q5_k", "q2_k", "q4_0", "fp16", "bf16",
             warm.STATS]
    rest = ["iq2_xxs", "int3-g64", "q6_k", "q3_k"]
    tasks = warm._tasks([first, rest])
    kinds = [t["kind"] for t in tasks]
    assert kinds.count("decode") == 1 and kinds.count("stats") == 1
    assert kinds.count("decode-iq") == 1
    by = {(t["kind"], ",".join(t["names"])): t for t in tasks}
    dec = by[("decode", "")]["id"]
    # the lattice i-quants' decoders are a task of their own, in the stage of the first
    iq = by[("decode-iq", "")]
    assert iq["stage"] == 1 and by[("finish", "iq2_xxs")]["deps"] == {
        iq["id"], by[("encode", "iq2_xxs")]["id"]}
    q4k = by[("encode", "q4_k,q5_k")]
    assert q4k["o2"] and not by[("encode", "q4_0")]["o2"] and not by[("encode", "iq2_xxs")]["o2"]
    assert by[("encode", "q2_k")]["deps"] == {q4k["id"]}
    assert by[("finish", "q5_k")]["deps"] == {q4k["id"], dec}
    assert by[("names", "int3-g64")]["deps"] == {by[("names", "int8-channel,int4-g128")]["id"]}
    assert not any(t["o2"] for t in tasks if t["kind"] in ("decode", "names", "stats", "finish"))
    assert by[("quick", "bf16")]["deps"] == {by[("quick", "fp16")]["id"]}
    # every scheme is in at least one task, and each task's stage is its names' stage
    named = {n for t in tasks for n in t["names"]}
    assert named == set(first + rest)
    assert all(t["stage"] == (0 if t["names"][0] in first else 1) for t in tasks if t["names"])


def test_pick_takes_the_earlier_stage_then_quick_finish_decode_then_costliest():
    tasks = warm._tasks([["int8-channel", "q4_k", "q4_0", "fp16", warm.STATS], ["iq2_xxs"]])
    by = {(t["kind"], ",".join(t["names"])): t["id"] for t in tasks}
    started, done = set(), set()
    t = warm._pick(tasks, started, done, False)
    assert t["kind"] == "quick"
    started.add(t["id"])
    t = warm._pick(tasks, started, done, False)
    assert t["kind"] == "decode"                 # every GGML scheme waits for it
    # an -O2 process takes only the encoders that may compile there: Q4_K's, not Q4_0's
    t = warm._pick(tasks, started, done, True)
    assert t["id"] == by[("encode", "q4_k")]
    started |= {by[("decode", "")], by[("encode", "q4_k")]}
    done |= {by[("decode", "")], by[("encode", "q4_k")]}
    assert warm._pick(tasks, started, done, False)["id"] == by[("finish", "q4_k")]
    # an -O3 process leaves what an -O2 one may take for last within a stage
    started.add(by[("finish", "q4_k")])
    t = warm._pick(tasks, started, done, False)
    assert not t["o2"] and t["stage"] == 0


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


def _fresh_process(code: str, *args) -> object:
    """The JSON `code` prints last, run in a new Python process (no kernel variant compiled or
    loaded by another test)."""
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


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
        "ks = (cpu_affine_fused.quant_rows, cpu_affine_dequant.affine_rows,\n"
        "      cpu_ggml.ggml_encode, cpu_ggml.ggml_rows)\n"
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
    before, after, kinds = _fresh_process(code)
    # quant_rows serves quantize and quantize_error both: still one variant
    assert before == [1] * 4 and after == before
    assert kinds == [[True]] * 4


def test_statistics_and_rtn_encoders_take_writable_inputs_read_only(tmp_path):
    """The entries numba had compiled a writable variant of on first use, beside the read-only
    one the warm-up compiles: the statistics of rows decoded in memory (an FP8 tensor's,
    writable float32; beside a checkpoint's float32 and int8 tensors), MXFP4's
    round-to-nearest encoder and MLX's quantize given writable weights. In a fresh process:
    every variant it has is one it compiled or loaded there."""
    import torch
    path = tmp_path / "m.pt"
    g = torch.Generator().manual_seed(0)
    torch.save({"a.weight": torch.randn(16, 64, generator=g),
                "b.weight": torch.randint(-128, 128, (16, 64), dtype=torch.int8, generator=g),
                "c.weight": torch.randn(16, 64, generator=g).to(torch.float8_e4m3fn)}, path)
    code = (
        "import json, sys\n"
        "import numpy as np\n"
        "from kernels import cpu_mlx, ggml_rtn_quant, stats_kernels\n"
        "from workbench.core.progress import run\n"
        "from workbench.formats.loaders import open_model\n"
        "from workbench.quant import accel\n"
        "from workbench.quant.stats import model_stats\n"
        "from workbench.schemes import get_scheme\n"
        "m = open_model(sys.argv[1])\n"
        "run(model_stats(m, cache=None))\n"
        "w = np.random.default_rng(1).standard_normal((64, 512)).astype(np.float32)\n"
        "for n in ('mxfp4', 'mlx-mxfp4'):\n"
        "    accel.quantize(get_scheme(n), w, backend='cpu')\n"
        "ks = (stats_kernels.row_moments, stats_kernels.hist_central,\n"
        "      ggml_rtn_quant.rtn_encode, cpu_mlx.mlx_quant_fp)\n"
        "print(json.dumps([sorted({(str(s[0].dtype), s[0].mutable) for s in k.signatures})\n"
        "                  for k in ks]))\n")
    kinds = _fresh_process(code, str(path))
    moments, hist, rtn, mlx = kinds
    assert moments == hist == [["float32", False], ["int8", False]], kinds
    assert rtn == mlx == [["float32", False]], kinds


def test_warm_up_compiles_each_kernel_a_scheme_family_reaches():
    """accel.warmup's one call per kind of scheme reaches the integer qparams kernels of a
    width the one-pass kernel does not take (sym_qparams) and of a per-tensor asymmetric
    scheme (int_qparams), and MLX's microscaling quantize beside its affine one; warm_stats
    the fisher measure's weighted errors. Each had compiled on first use (a default
    allocation's fisher errors, an odd-width tensor). In a fresh process: every variant it has
    is one it compiled or loaded there."""
    code = (
        "import json\n"
        "from kernels import cpu_affine_quant, cpu_mlx, stats_kernels\n"
        "from workbench.bench.warm import warm_stats\n"
        "from workbench.quant import accel\n"
        "accel.warmup(['int8-channel', 'int4-tensor-asym', 'mlx-q4-g64', 'mlx-mxfp4'],\n"
        "             backend='cpu')\n"
        "warm_stats()\n"
        "ks = (cpu_affine_quant.sym_qparams, cpu_affine_quant.int_qparams,\n"
        "      cpu_mlx.mlx_quant_affine, cpu_mlx.mlx_quant_fp,\n"
        "      stats_kernels._weighted_sq_err_rows, stats_kernels._cast_sq_err_rows)\n"
        "print(json.dumps([len(k.signatures) for k in ks]))\n")
    assert _fresh_process(code) == [1] * 6


class _FakeWorker:
    """A worker that answers each task at once (nothing compiles), one CPU second each."""
    made: list = []

    def __init__(self, i, o2, events):
        self.o2, self.cpu, self.events, self.n = o2, 0.0, events, 0
        _FakeWorker.made.append((i, o2))

    def send(self, task):
        self.n += 1
        self.events.put((self, f"done {task['id']} 1.00 {float(self.n):.2f}"))

    def close(self):
        return 0

    def kill(self):
        pass


def _fake_main(monkeypatch, jobs=2):
    _FakeWorker.made = []
    monkeypatch.setattr(warm, "_Worker", _FakeWorker)
    return warm.main(["--jobs", str(jobs)])


def test_the_header_says_how_long_the_warm_up_takes(monkeypatch, capsys):
    """The set-up's long step says up front how long it takes (its CPU cost over the cores it
    gets), before any kernel compiles."""
    monkeypatch.setattr(warm.os, "cpu_count", lambda: 2)
    assert _fake_main(monkeypatch) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert f"about {round(warm.FIRST_CPU_S / 2)} s for those" in head, head
    assert f"{round(warm.WARM_CPU_S / 2 / 60)} min for all on an idle machine" in head, head
    monkeypatch.setattr(warm.os, "cpu_count", lambda: 1)
    assert _fake_main(monkeypatch) == 0
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


def test_the_ready_line_comes_once_the_first_stage_is_done(monkeypatch, capsys):
    assert _fake_main(monkeypatch) == 0
    out = capsys.readouterr().out.splitlines()
    n = len(warm.first_stage())
    at = [i for i, line in enumerate(out) if "kernels: ready for the demo and MiniLM" in line]
    assert len(at) == 1 and f"({n} schemes)" in out[at[0]], out
    from workbench.schemes import list_schemes
    first = warm.first_stage() + [warm.STATS]
    tasks = warm._tasks([first, [n for n in list_schemes() if n not in first]])
    stage1 = sum(t["stage"] == 0 for t in tasks)
    # 1 CPU s a task: the first stage's, and at most one later task a process took while the
    # first stage's last tasks waited on their dependencies
    cpu = int(re.search(r"\((\d+) CPU s in the workers\)", out[at[0]]).group(1))
    assert stage1 <= cpu <= stage1 + 1, (stage1, out[at[0]])      # two processes
    before = " ".join(out[:at[0]])
    assert all(f"kernels: {s} ready" in before for s in warm.first_stage())
    assert "statistics" in before
    assert "kernels: iq2_xxs ready" in " ".join(out)        # then the rest
    assert out[-1].startswith("kernels compiled or loaded for")
    assert f", {len(tasks)} CPU s)" in out[-1], out[-1]
    # the second process starts at -O2 and, once only default-level work is left (the lattice
    # i-quants' encoders), is replaced by one at the default level
    assert _FakeWorker.made == [(0, False), (1, True), (1, False)], _FakeWorker.made


def test_a_worker_that_dies_fails_the_warm_up_naming_its_task(monkeypatch, capsys):
    class Dying(_FakeWorker):
        def send(self, task):
            if task["kind"] == "decode":
                self.events.put((self, None))           # the process ended mid-task
            else:
                super().send(task)
    _FakeWorker.made = []
    monkeypatch.setattr(warm, "_Worker", Dying)
    assert warm.main(["--jobs", "2"]) == 1
    err = capsys.readouterr().err
    assert "kernel warm-up failed in process" in err and "(decode;" in err, err


def test_ctrl_c_stops_the_workers_and_says_what_is_kept(monkeypatch, capsys):
    killed = []

    class Interrupted(_FakeWorker):
        def send(self, task):
            if task["kind"] == "decode":
                raise KeyboardInterrupt
            super().send(task)

        def kill(self):
            killed.append(self)
    _FakeWorker.made = []
    monkeypatch.setattr(warm, "_Worker", Interrupted)
    assert warm.main(["--jobs", "2"]) == 130
    assert "stays in the cache" in capsys.readouterr().err
    assert len(killed) == len(_FakeWorker.made) >= 1


def test_an_encode_task_leaves_the_decoders_alone():
    """A worker at -O2 compiles a family's encoders only: the decoders (ggml_rows, slower at
    -O2) are not even called, so they cannot be compiled there."""
    code = ("from workbench.bench import warm\n"
            "from kernels import cpu_ggml, kquant_affine\n"
            "warm.encode_names(['q4_k', 'q4_0'])\n"
            "warm.encode_names(['iq2_xxs'])\n"
            "print(len(cpu_ggml.ggml_rows.signatures), len(cpu_ggml.iq_rows.signatures),\n"
            "      len(kquant_affine.q45k_encode.signatures))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["0", "0", "1"], r.stdout
