"""`check --runtime mlx` (workbench.export.mlx_check) on mlx-lm's own folder of a tiny llama
(mlx_lm.convert, the mixed_3_6 recipe): the torch figures on the text, mlx-lm's own forward on
a chunk of it, the agreement of mlx-lm and transformers, the cached float side, and the
refusals before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e .[mlx])")

from tests.mlx_folders import mlx_quantized, run_cli as _cli, tiny_hf  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlxcheck")
    hf = tiny_hf("llama", root / "hf", tie_word_embeddings=True)
    other = tiny_hf("llama", root / "other", hidden_size=128, tie_word_embeddings=True)
    return {"hf": hf, "mixed": mlx_quantized(hf, root / "mixed", quant_predicate="mixed_3_6"),
            "other": mlx_quantized(other, root / "other-q4", q_bits=4, q_group_size=64)}



def test_folder_judged_in_torch_and_in_mlx_lm(tiny):
    """Measured on 63 tokens: mlx-lm's own KLD 0.00267, torch's on the same tokens 0.00271;
    the float forwards agree to 1e-14 (float32 both), the quantized ones to 2e-5."""
    argv = ("check", tiny["hf"], "--runtime", "mlx", "--mlx-folder", tiny["mixed"],
            "--ctx", "128", "--chunks", "3", "--json")
    rc, text, err = _cli(*argv)
    assert rc == 0, err
    res = json.loads(text)
    assert res["runtime"] == "mlx" and res["kld"]["chunks"] == 3
    assert res["bytes"] == sum(f.stat().st_size for f in Path(tiny["mixed"]).glob("*.safetensors"))
    m = res["mlx"]
    assert m["chunks"] == 1 and m["tokens"] == 63 and m["float_cache"] == "written"
    assert m["kld"]["mean"] > 1e-4                  # the 3-bit layers change the outputs
    assert abs(m["kld"]["mean"] - m["torch_kld"]["mean"]) < 0.1 * m["torch_kld"]["mean"]
    assert m["agreement"]["float"]["mean"] < 1e-9
    assert m["agreement"]["quantized"]["mean"] < 1e-3
    assert m["agreement"]["quantized"]["same_top1"] == 100.0
    # the float side from the cache: the same figures
    rc, text2, err = _cli(*argv)
    assert rc == 0, err
    again = json.loads(text2)["mlx"]
    assert again["float_cache"] == "hit"
    assert again["kld"] == {**m["kld"]} and again["agreement"] == m["agreement"]
    # mlx-lm on shorter chunks than the torch scoring's
    rc, text3, err = _cli(*argv[:-1], "--mlx-ctx", "64", "--mlx-chunks", "2", "--json")
    assert rc == 0, err
    short = json.loads(text3)
    assert (short["mlx"]["ctx"], short["mlx"]["chunks"], short["mlx"]["tokens"]) == (64, 2, 62)
    assert short["kld"] == res["kld"] | {"cache": "hit", "seconds": short["kld"]["seconds"]}


def test_refusals_before_any_work(tiny, tmp_path):
    base = ("check", tiny["hf"], "--ctx", "64")
    for argv, says in (
            ((*base, "--mlx-folder", tiny["mixed"]), "--runtime mlx"),
            ((*base, "--runtime", "mlx", "--mlx-folder", tiny["hf"]), "quantization"),
            ((*base, "--runtime", "mlx", "--mlx-folder", tiny["other"]), "quantization of "),
            (("check", tiny["mixed"], "--runtime", "mlx", "--mlx-folder", tiny["mixed"]),
             "float model")):
        rc, _, err = _cli(*argv)
        assert rc == 2 and says in err, (argv, err)
        assert len(err.strip().splitlines()) == 1, err


def test_a_plan_is_exported_and_judged(tiny, tmp_path):
    """--plan / --scheme: exported with export --format mlx into a temporary folder first; the
    same figures as judging that folder by hand."""
    plan = tmp_path / "plan.json"
    rc, _, err = _cli("export", tiny["hf"], "--scheme", "mlx-q4-g64", "--format", "plan",
                      "-o", plan)
    assert rc == 0, err
    rc, text, err = _cli("check", tiny["hf"], "--runtime", "mlx", "--plan", plan, "--ctx", "64",
                         "--chunks", "2", "--json")
    assert rc == 0, err
    res = json.loads(text)
    assert res["folder"] is None and res["seconds"]["export"] >= 0
    folder = tmp_path / "by-hand"
    assert _cli("export", tiny["hf"], "--plan", plan, "--format", "mlx", "-o", folder)[0] == 0
    assert res["bytes"] == sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    rc, text, err = _cli("check", tiny["hf"], "--runtime", "mlx", "--mlx-folder", folder,
                         "--ctx", "64", "--chunks", "2", "--json")
    assert rc == 0, err
    by_hand = json.loads(text)
    assert by_hand["kld"]["mean"] == res["kld"]["mean"]
    assert by_hand["mlx"]["kld"]["mean"] == res["mlx"]["kld"]["mean"]
