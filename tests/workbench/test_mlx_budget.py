"""`--budget-of` an mlx-lm folder (workbench.planning.mlx_budget): the sum of its .safetensors
files' sizes as a file budget for the mlx target, refused for other targets and for folders
that are not mlx-lm's, and a header bound that holds for mlx-lm's own folders."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e .[mlx])")

from tests.mlx_folders import mlx_quantized, tiny_hf  # noqa: E402
from workbench.core.errors import WorkbenchError  # noqa: E402
from workbench.planning.budget import budget_of, file_target  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlxbudget")
    hf = tiny_hf("llama", root / "hf", tie_word_embeddings=True)
    return {"hf": hf, "mixed": mlx_quantized(hf, root / "mixed", quant_predicate="mixed_3_6")}


def test_the_budget_is_the_folders_safetensors_bytes(tiny):
    folder = tiny["mixed"]
    b = budget_of(str(folder))
    assert (b.kind, b.format, b.source) == ("file", "mlx", str(folder))
    assert b.value == sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    assert "MLX safetensors" in b.describe()
    assert file_target(b, "any") == "mlx" and file_target(b, "mlx") == "mlx"
    with pytest.raises(WorkbenchError, match="target='mlx'"):
        file_target(b, "llama.cpp")


def test_other_folders_are_refused(tiny, tmp_path):
    with pytest.raises(WorkbenchError, match="no mlx \"quantization\""):
        budget_of(str(tiny["hf"]))
    broken = tmp_path / "broken"
    broken.mkdir()
    cfg = json.loads((tiny["mixed"] / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WorkbenchError, match="no .safetensors"):
        budget_of(str(broken))
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    with pytest.raises(WorkbenchError, match="--budget-of") as e:
        budget_of(str(broken))
    assert "\n" not in str(e.value)


def test_allocate_refuses_another_target_before_work(tiny, tmp_path):
    from workbench.cli import main
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = main(["allocate", str(tiny["hf"]), "--budget-of", str(tiny["mixed"]),
                   "--target", "llama.cpp", "-o", str(tmp_path / "p.json")])
    assert rc == 2 and "--target mlx" in err.getvalue(), err.getvalue()
    assert not (tmp_path / "p.json").exists()


def test_allocate_at_the_folders_bytes_exports_no_more(tiny, tmp_path):
    """allocate --target mlx --budget-of mlx-lm's mixed_3_6 folder, then export --format mlx:
    the written safetensors are no bigger than the folder's (measured: 982 bytes under, of
    642,558)."""
    from workbench.cli import main
    plan, out = tmp_path / "plan.json", tmp_path / "ours"
    budget = sum(f.stat().st_size for f in tiny["mixed"].glob("*.safetensors"))
    for argv in (["allocate", tiny["hf"], "--budget-of", tiny["mixed"], "--measure", "weight",
                  "-o", plan],
                 ["export", tiny["hf"], "--plan", plan, "--format", "mlx", "-o", out]):
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in argv])
        assert rc == 0, err.getvalue()[-800:]
    written = sum(f.stat().st_size for f in out.glob("*.safetensors"))
    assert written <= budget
    assert written > 0.9 * budget            # the budget is used, not left idle


def test_a_sharded_folder_counts_the_shards_its_index_lists(tiny, tmp_path):
    """The shards model.safetensors.index.json lists, as the loader reads them (one in a
    subfolder counted), not the folder's *.safetensors: a stray file the index does not list
    was counted (found by the fuzz, area mlx-budget), the subfolder's shard was not."""
    import shutil

    from safetensors.torch import load_file, save_file

    from workbench.formats.loaders import open_model
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(tiny["mixed"] / "config.json", folder / "config.json")
    tensors = load_file(str(tiny["mixed"] / "model.safetensors"))
    names = sorted(tensors)
    half = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
            "sub/model-00002-of-00002.safetensors": names[len(names) // 2:]}
    (folder / "sub").mkdir()
    for fname, part in half.items():
        save_file({n: tensors[n] for n in part}, str(folder / fname))
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {n: f for f, part in half.items() for n in part}}))
    save_file({"stray.weight": tensors[names[0]]}, str(folder / "model-stray.safetensors"))
    want = sum((folder / f).stat().st_size for f in half)
    assert budget_of(str(folder)).value == want
    assert sorted(open_model(folder).tensors) == sorted(open_model(tiny["mixed"]).tensors)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {names[0]: "../outside.safetensors"}}))
    with pytest.raises(WorkbenchError, match="outside") as e:
        budget_of(str(folder))
    assert "model.safetensors.index.json" in str(e.value)
