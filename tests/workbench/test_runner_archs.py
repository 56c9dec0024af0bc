"""The layer-by-layer runner on the tiny models of every architecture (tests/tiny_archs.py):
its outputs equal a plain whole-model transformers forward (``from_pretrained`` of the same
folder), and check / calibrate / fisher / the methods run and give sensible numbers."""

import json

import numpy as np
import pytest

pytest.importorskip("transformers")
import torch  # noqa: E402

from tests.tiny_archs import ARCHS, ENCODERS, MOE  # noqa: E402
from workbench.cli import main  # noqa: E402
from workbench.formats.loaders import open_model  # noqa: E402
from workbench.quant.plan import KEEP, Plan, Rule  # noqa: E402
from workbench.core.progress import run  # noqa: E402

ALL = list(ARCHS)
N, LEN = 4, 24          # calibration samples, tokens: keeps the suite quick


def _reference(folder, kind):
    import transformers
    cls = transformers.AutoModel if kind == "encoder" else transformers.AutoModelForCausalLM
    return cls.from_pretrained(str(folder), attn_implementation="eager").eval()


def _data(model):
    from workbench.running.calibration import calibration_samples
    return run(calibration_samples(model, None, N, LEN))


@pytest.mark.parametrize("arch", ALL)
def test_layer_by_layer_equals_whole_model_forward(tiny_arch, arch):
    from workbench.running.runner_passes import get_runner, run_outputs
    folder = tiny_arch(arch)
    model = open_model(str(folder))
    r = get_runner(model, "cpu")
    assert r.kind == ("encoder" if arch in ENCODERS else "causal-lm")
    assert all(p.device.type == "meta" for p in r.net.parameters())   # the skeleton holds none
    data = _data(model)
    out = run(run_outputs(r, data, batch_size=3))      # padded batches of mixed lengths
    assert all(p.device.type == "meta" for p in r.net.parameters())   # every block freed
    ref = _reference(folder, r.kind)
    worst = 0.0
    for s, o in zip(data, out):
        with torch.no_grad():
            ids = torch.from_numpy(s)[None]
            if r.kind == "encoder":
                want = ref(input_ids=ids).last_hidden_state.mean(1)[0].numpy()
                worst = max(worst, float(np.abs(want - o).max() / np.abs(want).max()))
            else:
                lp = torch.log_softmax(ref(input_ids=ids).logits.float(), -1)[0, :len(s) - 1]
                assert o.shape == tuple(lp.shape)
                worst = max(worst, float(np.abs(lp.numpy() - o).max()))
    assert worst < 1e-4, f"{arch}: layer-by-layer differs from the whole model by {worst}"


@pytest.mark.parametrize("arch", ALL)
def test_check_figures(tiny_arch, arch):
    from workbench.running.runner_jobs import check
    model = open_model(str(tiny_arch(arch)))
    keep = run(check(model, Plan(default=KEEP), samples=N, max_len=LEN))
    q8 = run(check(model, Plan(default="q8_0"), samples=N, max_len=LEN))
    q4 = run(check(model, Plan(default="q4_0"), samples=N, max_len=LEN))
    assert keep["samples"] == N
    if arch in ENCODERS:
        assert keep["cosine_min"] > 1 - 1e-6
        assert 1 > q8["cosine_mean"] > q4["cosine_mean"] > 0.5
    else:
        assert keep["kl_max"] < 1e-6 and keep["top1_agree"] == 1.0
        assert keep["ppl"] == pytest.approx(keep["ppl_base"], rel=1e-5)
        # (the tiny gemma2's soft-capped logits are saturated: tiny but positive KL)
        assert 0 <= q8["kl_mean"] < q4["kl_mean"] < 5 and q4["ppl"] != q4["ppl_base"]
        assert q8["top1_agree"] >= q4["top1_agree"] > 0.3
        assert q8["ppl_base"] == pytest.approx(keep["ppl_base"], rel=1e-6)


def test_check_matches_whole_model_kl(tiny_arch):
    """check's chunked KL equals KL computed from two whole-model forwards (original and the
    plan's dequantized weights loaded into a transformers model)."""
    from workbench.running.runner_jobs import check
    from workbench.quant.streaming import dequantized
    from workbench.running.runner_passes import get_runner
    folder = tiny_arch("qwen3_moe")
    model = open_model(str(folder))
    plan = Plan(default=KEEP, rules=[Rule("re:.*experts\\.2\\..*", "q4_0"),
                                     Rule("re:.*self_attn\\.o_proj.*", "q4_0")])
    res = run(check(model, plan, samples=N, max_len=LEN))
    ref = _reference(folder, "causal-lm")
    quant = _reference(folder, "causal-lm")
    r = get_runner(model, "cpu")
    sd = dict(quant.named_parameters())
    with torch.no_grad():
        for n, s in plan.resolve(model).items():
            if s == KEEP:
                continue
            slot = r.slots[n]
            slot.region(sd[slot.param].data).copy_(torch.from_numpy(dequantized(model, n, s)))
    kls = []
    for s in _data(model):
        with torch.no_grad():
            ids = torch.from_numpy(s)[None]
            lb = torch.log_softmax(ref(input_ids=ids).logits[0, :-1].double(), -1)
            lq = torch.log_softmax(quant(input_ids=ids).logits[0, :-1].double(), -1)
        kls.append((lb.exp() * (lb - lq)).sum(-1).numpy())
    kl = np.concatenate(kls)
    assert res["kl_mean"] > 1e-4
    assert res["kl_mean"] == pytest.approx(float(kl.mean()), rel=1e-4)
    assert res["kl_max"] == pytest.approx(float(kl.max()), rel=1e-4)


def test_one_expert_swap_writes_exactly_its_slice(tiny_arch):
    from workbench.running.runner_passes import get_runner
    model = open_model(str(tiny_arch("qwen3_moe")))
    r = get_runner(model, "cpu")
    name = "model.layers.1.mlp.experts.2.up_proj.weight"
    slot = r.slots[name]
    assert slot.param == "model.layers.1.mlp.experts.gate_up_proj" and slot.expert == 2 \
        and (slot.part, slot.parts) == (1, 2)
    orig = r.param_tensor(slot.param)
    new = np.full(model.info(name).shape, 7.0, np.float32)
    got = r.param_tensor(slot.param, lambda n: new if n == name else None)
    inter = orig.shape[1] // 2
    assert torch.equal(got[2, inter:], torch.full_like(got[2, inter:], 7.0))
    changed = (got != orig)
    changed[2, inter:] = False
    assert not bool(changed.any())
    # the per-expert checkpoint tensors are exactly transformers' fused layout
    np.testing.assert_array_equal(orig[2, :inter].numpy(),
                                  model.read("model.layers.1.mlp.experts.2.gate_proj.weight"))
    np.testing.assert_array_equal(
        r.param_tensor("model.layers.1.mlp.experts.down_proj")[3].numpy(),
        model.read("model.layers.1.mlp.experts.3.down_proj.weight"))


@pytest.mark.parametrize("arch", sorted(MOE))
def test_expert_statistics_come_from_routed_tokens(tiny_arch, arch):
    """Each expert's E[x^2] is over the tokens routed to it: summed over experts it is top-k
    times the router's (whose input is every token), and expert_usage agrees with the counts."""
    from workbench.running.imatrix import collect
    from workbench.running.runner_jobs import expert_usage
    from workbench.running.runner_passes import get_runner
    model = open_model(str(tiny_arch(arch)))
    r = get_runner(model, "cpu")
    k = int(r.config.num_experts_per_tok)
    stats, n, _ = run(collect(model, samples=N, max_len=LEN))
    use = run(expert_usage(model, samples=N, max_len=LEN))
    layer = len(r.layers) - 1
    router = [x for x in stats if f".{layer}." in x and x.endswith("gate.weight")
              and "experts" not in x]
    assert len(router) == 1, router
    s2_r, cnt_r = stats[router[0]]
    n_exp = 4
    gates = [x for x in stats if f"layers.{layer}." in x and ".experts." in x
             and (x.endswith("gate_proj.weight") or x.endswith("w1.weight"))]
    assert len(gates) == n_exp
    assert sum(stats[g][1] for g in gates) == k * cnt_r
    np.testing.assert_allclose(sum(stats[g][0] for g in gates), k * s2_r, rtol=1e-4)
    assert all(0 < stats[g][1] < cnt_r for g in gates)        # a real split, not all tokens
    for g in gates:
        assert use[g] == pytest.approx(stats[g][1] / cnt_r)
    assert sum(use[g] for g in gates) == pytest.approx(k)
    downs = [g.replace("gate_proj", "down_proj").replace("w1", "w2") for g in gates]
    for g, d in zip(gates, downs):
        assert stats[d][1] == stats[g][1] and len(stats[d][0]) == model.info(d).shape[1]
    if arch == "deepseek_v3":   # the shared expert sees every token
        sh = f"model.layers.{layer}.mlp.shared_experts.gate_proj.weight"
        assert stats[sh][1] == cnt_r


@pytest.mark.parametrize("arch", ["llama", "qwen3_moe", "gpt2", "bert"])
def test_fisher_equals_whole_model_autograd(tiny_arch, arch):
    """Block-level checkpointing gives the gradients of a whole-model backward: the same
    probes (same generator sequence) through a transformers model give the same F."""
    from workbench.running.calibration import batches
    from workbench.running.runner_passes import get_runner
    from workbench.planning.fisher import fisher_diagonals
    folder = tiny_arch(arch)
    model = open_model(str(folder))
    r = get_runner(model, "cpu")
    diag, count = run(fisher_diagonals(model, samples=N, max_len=LEN, probes=2, batch_size=3))
    ref = _reference(folder, r.kind)
    gen = torch.Generator().manual_seed(0)
    data = sorted(_data(model), key=len)
    acc = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
    for ids, mask in batches(data, 3):
        ids_t, mask_t = torch.from_numpy(ids), torch.from_numpy(mask)
        for _ in range(2):
            ref.zero_grad(set_to_none=True)
            if r.kind == "encoder":
                h = ref(input_ids=ids_t, attention_mask=mask_t).last_hidden_state
                m = mask_t.unsqueeze(-1).to(h.dtype)
                b = (h * m).sum(1) / m.sum(1).clamp(min=1)
                bd = b.detach()
                nrm = bd.norm(dim=1, keepdim=True).clamp(min=1e-30)
                u = bd / nrm
                z = torch.randn(bd.shape, generator=gen)
                z = z - (z * u).sum(1, keepdim=True) * u
                obj = (b * (z / nrm)).sum()
            else:
                logits = ref(input_ids=ids_t, attention_mask=mask_t).logits.float()
                rows = [(i, t) for i in range(ids.shape[0]) for t in range(int(mask[i].sum()) - 1)]
                ii = torch.tensor([a for a, _ in rows])
                tt = torch.tensor([c for _, c in rows])
                z = logits[ii, tt]                 # the Gaussian probe of the logits' Fisher
                p = torch.softmax(z.detach(), -1)
                e = torch.randn(p.shape, generator=gen)
                v = p.sqrt() * e - p * (p.sqrt() * e).sum(-1, keepdim=True)
                obj = (z * v).sum()
            obj.backward()
            for n, p in ref.named_parameters():
                if p.grad is not None:
                    acc[n] += p.grad ** 2
    compared = 0
    for n, f in diag.items():
        slot = r.slots[n]
        if slot.param not in acc or r.tied and n in r._source(r.head_params[0]):
            continue     # a tied table: its two uses' squares add (documented), not exact
        want = slot.region(acc[slot.param] / 2).numpy()
        if want.shape != f.shape:
            want = want.T
        assert np.abs(want - f).max() <= 1e-3 * np.abs(want).max() + 1e-12, n
        compared += 1
    assert compared >= 10 and count > 0


@pytest.mark.parametrize("arch", ALL)
def test_calibrate_fisher_allocate_cli(tiny_arch, arch, tmp_path, capsys):
    from workbench.core.errors import WorkbenchError
    from workbench.formats.llama_names import detect_family
    from workbench.running.imatrix import collect, read_imatrix
    folder = str(tiny_arch(arch))
    model = open_model(folder)
    stats, n, longest = run(collect(model, samples=3))
    assert n == 3 and len(stats) >= 4
    assert all(c > 0 and s2.min() >= 0 and s2.max() > 0 for s2, c in stats.values())
    try:
        detect_family(model)      # the llama.cpp names the imatrix file needs
    except WorkbenchError:
        mapped = False
    else:
        mapped = True
    if mapped:
        im = tmp_path / "im.gguf"
        assert main(["calibrate", folder, "--samples", "3", "-o", str(im), "--device",
                     "cpu"]) == 0
        assert len(read_imatrix(im)) >= 4
    capsys.readouterr()
    assert main(["sensitivity", folder, "--measure", "fisher", "--schemes", "q4_0,q8_0",
                 "--samples", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["measure"] == "fisher"
    q4 = [t["q4_0"]["value"] for t in out["tensors"].values()]
    q8 = [t["q8_0"]["value"] for t in out["tensors"].values()]
    assert all(np.isfinite(q4)) and max(q4) > 0
    assert sum(q4) > 10 * sum(q8) > 0          # 4 bits hurt more than 8, by far
    plan = tmp_path / "plan.json"
    assert main(["allocate", folder, "--measure", "fisher", "--schemes", "q4_0,q8_0",
                 "--samples", "3", "--budget-bpw", "7", "-o", str(plan), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["measure"] == "fisher" and res["bits_per_weight"] <= 7.0
    assert res["schemes"].get("q4_0", 0) > 0 and res["schemes"].get("q8_0", 0) > 0
    assert json.loads(plan.read_text())["rules"]


def test_device_flag(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert main(["check", "--scheme", "q8_0", "--samples", "2", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda" in err and "no CUDA GPU" in err and "Traceback" not in err
    from workbench.running.runner_config import set_device
    set_device(None)


def test_unknown_architecture_is_one_clear_error(tmp_path, capsys):
    import shutil
    from tests.tiny_archs import DEMO
    for f in DEMO.iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["model_type"] = "no_such_arch"
    cfg["architectures"] = ["NoSuchForCausalLM"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert main(["check", str(tmp_path), "--scheme", "q8_0", "--samples", "2"]) == 2
    err = capsys.readouterr().err
    assert "no_such_arch" in err and "weight-only features still work" in err
    assert main(["evaluate", str(tmp_path), "--scheme", "q8_0", "--json"]) == 0


def test_activations_spilled_to_disk_give_the_same_figures(tiny_arch, monkeypatch):
    from workbench.running.runner_store import ActivationStore, new_budget
    from workbench.running.runner_jobs import check
    model = open_model(str(tiny_arch("llama")))
    plan = Plan(default="q4_0")
    ram = run(check(model, plan, samples=N, max_len=LEN, batch_size=2))
    monkeypatch.setenv("QUANT_WORKBENCH_ACTIVATION_MB", "0.001")     # ~1 kB: every batch spills
    spilled = []
    orig_put = ActivationStore.put

    def put(self, key, t):
        orig_put(self, key, t)
        spilled.append(self.items[key][0] == "disk")
    monkeypatch.setattr(ActivationStore, "put", put)
    disk = run(check(model, plan, samples=N, max_len=LEN, batch_size=2))
    assert spilled and all(spilled)
    assert new_budget()["limit"] < 2048
    for k, v in ram.items():
        assert disk[k] == (pytest.approx(v, rel=1e-9) if isinstance(v, float) else v)


def test_gguf_named_checkpoint_with_merged_experts_runs_the_same(tiny_arch, tmp_path):
    """A GGUF with llama.cpp names (its general.architecture picks gguf-py's name map) and
    merged 3-D `blk.N.ffn_*_exps` expert tensors maps onto the fused expert parameters."""
    import re
    import shutil

    import gguf
    from safetensors.numpy import load_file

    from workbench.running.runner_passes import get_runner, run_outputs
    src = tiny_arch("qwen3_moe")
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, tmp_path / f)
    t = load_file(str(src / "model.safetensors"))
    nm = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3MOE, 2)
    w = gguf.GGUFWriter(str(tmp_path / "model.gguf"), "qwen3moe")
    merged: dict = {}
    for n, a in t.items():
        m = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight", n)
        if m:
            merged.setdefault((int(m[1]), m[3]), {})[int(m[2])] = a
            continue
        w.add_tensor(nm.get_name(n, try_suffixes=(".weight", ".bias")), a)
    for (layer, p), d in merged.items():
        w.add_tensor(f"blk.{layer}.ffn_{p}_exps.weight", np.stack([d[e] for e in sorted(d)]))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    hf, gg = open_model(str(src)), open_model(str(tmp_path / "model.gguf"))
    rg = get_runner(gg, "cpu")
    assert rg.slots["blk.1.ffn_up_exps.weight"].param == "model.layers.1.mlp.experts.gate_up_proj"
    assert rg.slots["blk.1.ffn_up_exps.weight"].part == 1
    data = _data(hf)
    a = run(run_outputs(get_runner(hf, "cpu"), data))
    b = run(run_outputs(rg, data))
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) < 1e-5


def test_llama_gguf_with_permuted_qk_runs_the_same(tiny_arch, tmp_path):
    """convert_hf_to_gguf stores Llama q/k rows permuted for llama.cpp's rope
    (w.reshape(heads, 2, d/2, ...).swapaxes(1, 2)); the runner undoes it."""
    import shutil

    import gguf
    from safetensors.numpy import load_file

    from workbench.running.runner_passes import get_runner, run_outputs
    src = tiny_arch("llama")
    for f in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, tmp_path / f)
    cfg = json.loads((src / "config.json").read_text())
    t = load_file(str(src / "model.safetensors"))
    nm = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    w = gguf.GGUFWriter(str(tmp_path / "model.gguf"), "llama")
    for n, a in t.items():
        heads = {"q_proj": cfg["num_attention_heads"], "k_proj": cfg["num_key_value_heads"]}
        for k, h in heads.items():
            if f"self_attn.{k}." in n:
                a = a.reshape(h, 2, a.shape[0] // h // 2, *a.shape[1:]).swapaxes(1, 2) \
                    .reshape(a.shape).copy()
        w.add_tensor(nm.get_name(n, try_suffixes=(".weight", ".bias")), a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    hf, gg = open_model(str(src)), open_model(str(tmp_path / "model.gguf"))
    data = _data(hf)
    a = run(run_outputs(get_runner(hf, "cpu"), data))
    b = run(run_outputs(get_runner(gg, "cpu"), data))
    assert max(float(np.abs(x - y).max()) for x, y in zip(a, b)) < 1e-5


def test_moe_imatrix_round_trip(tiny_arch, tmp_path, capsys):
    """calibrate writes one llama.cpp entry per merged expert tensor (a row of sums and a count
    per expert, as llama-imatrix writes blk.N.ffn_up_exps), and --imatrix gives each Hugging
    Face expert tensor its own row back."""
    from workbench.running.imatrix import collect, read_imatrix
    from workbench.core.progress import run
    from workbench.running.imatrix import second_moments
    folder = str(tiny_arch("qwen3_moe"))
    im = tmp_path / "im.gguf"
    assert main(["calibrate", folder, "--samples", "3", "-o", str(im)]) == 0
    capsys.readouterr()
    assert read_imatrix(str(im))["blk.1.ffn_up_exps.weight"].size == 4 * 256
    model = open_model(folder)
    d = run(second_moments(model, imatrix=str(im)))
    stats, _, _ = run(collect(model, None, 3))
    for e in range(4):
        n = f"model.layers.1.mlp.experts.{e}.up_proj.weight"
        s2, c = stats[n]
        np.testing.assert_allclose(d[n], np.asarray(s2) / max(c, 1), rtol=1e-5, atol=1e-12)
    assert not np.allclose(d["model.layers.1.mlp.experts.0.up_proj.weight"],
                           d["model.layers.1.mlp.experts.1.up_proj.weight"])


@pytest.mark.parametrize("arch", ["llama"])
def test_fisher_head_kept_pairs_equal_the_buffer(tiny_arch, arch, monkeypatch):
    """The head's weight gradient formed at flush a vocabulary chunk at a time from the kept
    (dz, x) gives the F of the vocabulary x hidden buffer path (taken when the kept pairs
    would outgrow a quarter of it); each path is seen taken."""
    from workbench.running import runner_measures as rm
    from workbench.planning import fisher
    from workbench.planning.fisher import fisher_diagonals
    model = open_model(str(tiny_arch(arch)))
    monkeypatch.setattr(fisher, "_FISHER_CACHE", {})
    seen = []
    real_flush = rm.HeadGrads.flush

    def flush(self, acc):
        seen.append("buffer" if self.w is not None else "pairs" if self.pairs else "none")
        return real_flush(self, acc)
    monkeypatch.setattr(rm.HeadGrads, "flush", flush)
    monkeypatch.setattr(rm.HeadGrads, "ROW_ELEMENTS", 7 * 64)    # several vocabulary chunks
    monkeypatch.setattr(rm.HeadGrads, "KEEP_DIVISOR", 1)     # a tiny model's hidden is small
    kept, _ = run(fisher_diagonals(model, samples=N, max_len=LEN, probes=2, batch_size=3))
    assert seen and set(seen) == {"pairs"}, seen
    seen.clear()
    monkeypatch.setattr(rm.HeadGrads, "KEEP_DIVISOR", 10 ** 12)
    monkeypatch.setattr(fisher, "_FISHER_CACHE", {})
    buf, _ = run(fisher_diagonals(model, samples=N, max_len=LEN, probes=2, batch_size=3))
    assert seen and set(seen) == {"buffer"}, seen
    assert kept.keys() == buf.keys()
    for n in kept:
        a, b = np.asarray(kept[n]), np.asarray(buf[n])
        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max() + 1e-12, n
