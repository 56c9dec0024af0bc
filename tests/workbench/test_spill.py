"""Model-level results that outgrow RAM live in memory-mapped files (workbench.core.spill): the
Fisher diagonal, GPTQ's Hessians, GPTQ on a tensor too big to hold whole (row chunks). Each
spilled or chunked path gives the figures of the in-memory path (tiny models, every array
forced to disk, every tensor forced to chunks)."""

import numpy as np
import pytest

pytest.importorskip("transformers")

from workbench.core import spill
from workbench.quant import streaming  # noqa: E402
from workbench.formats.loaders import open_model  # noqa: E402
from workbench.quant.plan import Plan  # noqa: E402
from workbench.core.progress import run  # noqa: E402

N, LEN = 4, 24


def test_spill_arrays_are_mapped_unlinked_files_with_the_same_values(tmp_path, monkeypatch):
    monkeypatch.setenv("QUANT_WORKBENCH_SPILL_DIR", str(tmp_path))
    monkeypatch.setattr(spill, "CHUNK_ELEMENTS", 7 * 33)          # ragged row chunks
    monkeypatch.setattr(spill, "MIN_BYTES", 4 * 300)
    a = spill.zeros((300, 33))
    assert isinstance(a, np.memmap) and not any(tmp_path.iterdir())   # unlinked at once
    g = np.random.default_rng(0).standard_normal((300, 33)).astype(np.float32)
    spill.add_squares(a, g, 0.5)
    spill.add_squares(a, g, 0.5)
    np.testing.assert_allclose(a, g * g, rtol=1e-6)
    b = spill.to_disk(g.T)                                          # a transposed view
    assert isinstance(b, np.memmap) and np.array_equal(b, g.T)
    c = spill.contiguous(g.T)
    assert c.flags.c_contiguous and np.array_equal(c, g.T)
    spill.add_into(b, g.T)
    assert np.array_equal(b, 2 * g.T)
    assert spill.any_nonzero(a) and not spill.any_nonzero(spill.zeros((300, 33)))
    assert not isinstance(spill.zeros((4,)), np.memmap)            # small: in RAM


def _spill_mappings(skip=frozenset()):
    """(mapped kB, resident kB, address ranges) of this process's workbench.core.spill files
    (/proc/self/smaps), leaving out the ranges in `skip` (mappings that other tests' caches
    still hold)."""
    import os
    if not os.path.exists("/proc/self/smaps"):
        pytest.skip("no /proc/self/smaps")
    size = rss = 0
    ranges = set()
    spill_map = False
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                spill_map = "qw-spill-" in line and head[0] not in skip
                if spill_map:
                    ranges.add(head[0])
            elif spill_map and line.startswith("Size:"):
                size += int(head[1])
            elif spill_map and line.startswith("Rss:"):
                rss += int(head[1])
    return size, rss, ranges


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe", "gpt2"])
def test_fisher_on_disk_and_in_row_chunks_equals_in_memory(tiny_arch, arch, monkeypatch):
    """Every parameter's squared-gradient sum in a mapped file, every tensor's error in row
    chunks: the same diagonal and the same fisher errors."""
    from workbench.planning import fisher
    from workbench.planning.fisher import fisher_diagonals, fisher_errors
    model = open_model(str(tiny_arch(arch)))
    schemes = ["q4_0", "int4-g32"]
    fisher._FISHER_CACHE.clear()
    ram, count = run(fisher_diagonals(model, samples=N, max_len=LEN, batch_size=3))
    want = run(fisher_errors(model, schemes, ram, count))
    fisher._FISHER_CACHE.clear()
    monkeypatch.setattr(spill, "MIN_BYTES", 0)                    # every array on disk
    monkeypatch.setattr(spill, "CHUNK_ELEMENTS", 64 * 5)
    from workbench.running import runner_measures     # (a small model's sums stay in RAM)
    monkeypatch.setattr(runner_measures, "RESIDENT_BYTES", 0)
    others = _spill_mappings()[2]
    disk, count2 = run(fisher_diagonals(model, samples=N, max_len=LEN, batch_size=3))
    fisher._FISHER_CACHE.clear()
    # every mapped F's pages are let go once written and read, whole or in row chunks (a
    # large model's F never piles up in the resident set; before, nearly all of it stayed).
    # A read fault maps up to 64 kB of cached neighbours back in (the kernel's fault-around),
    # a large share of these tiny files: hence the 15 % allowance
    whole = run(fisher_errors(model, schemes, disk, count2))
    size, rss, _ = _spill_mappings(others)
    assert size > 0 and rss <= 0.15 * size, (rss, size)
    monkeypatch.setattr(streaming, "STREAM_ELEMENTS", 1)          # every tensor in row chunks
    monkeypatch.setattr(streaming, "CHUNK_ELEMENTS", 64 * 3)
    got = run(fisher_errors(model, schemes, disk, count2))
    size, rss, _ = _spill_mappings(others)
    assert size > 0 and rss <= 0.15 * size, (rss, size)
    assert whole == pytest.approx(want, rel=1e-5, abs=1e-15)
    assert count2 == count and set(disk) == set(ram)
    mapped = [n for n, f in disk.items() if isinstance(f, np.memmap)
              or isinstance(getattr(f, "base", None), np.memmap)]
    assert len(mapped) >= len(disk) // 2, "the diagonal was not spilled to files"
    for n, f in ram.items():
        np.testing.assert_allclose(disk[n], f, rtol=1e-5, atol=1e-12 * float(np.abs(f).max()),
                                   err_msg=n)
    assert set(got) == set(want) and any(v > 0 for v in want.values())
    for k, v in want.items():
        assert got[k] == pytest.approx(v, rel=1e-5, abs=1e-15), k


def test_gptq_statistics_spilled_block_by_block_and_chunked_rows_equal_whole(tiny_arch,
                                                                            monkeypatch):
    """GPTQ's Hessians go to mapped files as each block finishes (the collector holds one
    block's), and a tensor quantized by GPTQ in row chunks equals the whole-tensor result."""
    from workbench.quant.evaluate import evaluate
    from workbench.running import methods_apply as apply
    model = open_model(str(tiny_arch("llama")))
    plan = Plan("q4_k", method="gptq")
    # use_cache False: the fits of the first prepare, kept, would spare the second its
    # statistics pass (workbench.running.method_fits), and the statistics are the point here
    mm = run(apply.prepare(model, plan, samples=N, use_cache=False))
    whole = run(evaluate(mm, plan, cache=None))
    assert any(r.method == "gptq" for r in whole.tensors.values())
    monkeypatch.setattr(spill, "MIN_BYTES", 0)
    live_max = []
    done_orig = apply.LayerStats.spilled

    def spilled(self):
        live_max.append(self)
        return done_orig(self)
    monkeypatch.setattr(apply.LayerStats, "spilled", spilled)
    mm2 = run(apply.prepare(model, plan, samples=N, use_cache=False))
    assert len(live_max) == len(mm2.stats) > 0
    assert all(isinstance(st.H, np.memmap) for st in mm2.stats.values() if st.H is not None)
    for n, st in mm.stats.items():
        np.testing.assert_array_equal(np.asarray(mm2.stats[n].H), st.H)
    assert all(st.X is None for st in mm2.stats.values())          # GPTQ keeps no input rows
    monkeypatch.setattr(streaming, "STREAM_ELEMENTS", 1)
    monkeypatch.setattr(streaming, "CHUNK_ELEMENTS", 256 * 8)
    chunked = run(evaluate(mm2, plan, cache=None))
    by = whole.tensors
    hit = 0
    for r in chunked.tensors.values():
        a = by[r.name]
        assert (r.scheme, r.bytes, r.method) == (a.scheme, a.bytes, a.method), r.name
        assert r.error.rel_rmse == pytest.approx(a.error.rel_rmse, rel=1e-6), r.name
        hit += r.method == "gptq" and streaming.method_streamed(mm2, model.info(r.name), r.name,
                                                                 r.scheme)
    assert hit >= 5


def test_input_pass_reports_each_block_done_before_the_next(tiny_arch):
    from workbench.running.runner_passes import get_runner
    from workbench.running.runner_jobs import input_pass
    model = open_model(str(tiny_arch("llama")))
    r = get_runner(model, "cpu")
    events = []
    run(input_pass(model, None, N, LEN, observe=lambda n, x: events.append(("obs", n)),
                   done=lambda names: events.append(("done", tuple(names)))))
    done_at = {n: i for i, (k, ns) in enumerate(events) if k == "done" for n in ns}
    assert set(done_at) == {n for k, n in events if k == "obs"}
    for i, (k, n) in enumerate(events):
        if k == "obs":
            assert i < done_at[n]        # never observed after its block was reported done
    blocks = [r.block_of(n) for k, ns in events if k == "done" for n in ns]
    assert blocks == sorted(blocks, key=lambda b: (b == "head", b if b != "head" else 0))


@pytest.mark.parametrize("scheme", ["q4_k", "int4-g32", "q8_0"])
def test_dequantized_in_row_chunks_equals_whole(scheme, monkeypatch, demo_model_path):
    """What `check` loads for a big tensor (the head, the embeddings) is quantized a row chunk
    at a time: the same values as the whole tensor quantized at once."""
    from workbench.quant.streaming import dequantized
    model = open_model(str(demo_model_path))
    names = [n for n in model.tensors if model.info(n).ndim == 2][:4]
    whole = {n: dequantized(model, n, scheme) for n in names}
    monkeypatch.setattr(streaming, "STREAM_ELEMENTS", 1)
    monkeypatch.setattr(streaming, "CHUNK_ELEMENTS", 256 * 7)
    for n in names:
        got = dequantized(model, n, scheme)
        assert got.dtype == np.float32 and np.array_equal(got, whole[n]), n


def test_an_embeddings_fisher_comes_from_the_rows_of_the_tokens_seen(tiny_arch, monkeypatch):
    """The embedding table's gradient in the pass is sparse (the rows of the batch's tokens),
    never a dense table-sized array: its squares are added row by row, rows no token used
    stay 0, and the module's own flag is back afterwards."""
    import torch
    from workbench.planning import fisher
    from workbench.running.runner_passes import get_runner
    model = open_model(str(tiny_arch("llama")))
    calls = []
    real = spill.add_row_squares

    def spy(dst, rows, grad, scale=1.0):
        calls.append(len(rows))
        return real(dst, rows, grad, scale)
    monkeypatch.setattr(spill, "add_row_squares", spy)
    fisher._FISHER_CACHE.clear()
    diag, _count = run(fisher.fisher_diagonals(model, samples=N, max_len=LEN, batch_size=3))
    fisher._FISHER_CACHE.clear()
    emb = np.asarray(diag["model.embed_tokens.weight"])
    seen = np.flatnonzero(emb.any(axis=1))
    assert calls and max(calls) <= len(seen) < emb.shape[0]
    assert (emb[seen] > 0).any(axis=1).all()
    r = get_runner(model, "cpu")
    mods = [m for m in r.net.modules() if isinstance(m, torch.nn.Embedding)]
    assert mods and not any(m.sparse for m in mods)
    dense = np.zeros((10, 4), np.float32)
    g = torch.randn(3, 4)
    spill.add_row_squares(dense, [7, 2, 5], g, 0.5)
    want = np.zeros((10, 4), np.float32)
    want[[7, 2, 5]] = 0.5 * g.numpy() ** 2
    assert np.array_equal(dense, want)


def test_a_small_models_pass_reads_each_weight_once(tiny_arch, monkeypatch):
    """Below RESIDENT_BYTES the fisher pass keeps the weights it widened (the backward visits
    each block again) and lets them go when it ends; above, it reads them per visit."""
    from workbench.planning import fisher
    from workbench.planning.fisher import fisher_diagonals
    from workbench.running import runner_measures
    from workbench.running.runner import Runner
    from workbench.running.runner_passes import get_runner
    model = open_model(str(tiny_arch("llama")))
    reads: list = []
    real = Runner.param_tensor
    monkeypatch.setattr(Runner, "param_tensor",
                        lambda self, pn, override=None: reads.append(pn) or real(self, pn, override))
    counts = {}
    for limit in (runner_measures.RESIDENT_BYTES, 0):
        monkeypatch.setattr(runner_measures, "RESIDENT_BYTES", limit)
        fisher._FISHER_CACHE.clear()
        reads.clear()
        diag, _ = run(fisher_diagonals(model, samples=N, max_len=LEN, batch_size=3))
        counts[limit] = (len(reads), len(set(reads)), diag)
        assert get_runner(model).resident is None           # nothing held after the pass
    (n_small, uniq, d_small), (n_big, uniq_big, d_big) = counts.values()
    assert n_small == uniq and n_big > 1.5 * n_small and uniq_big == uniq
    for k in d_small:
        assert np.array_equal(np.asarray(d_small[k]), np.asarray(d_big[k])), k
