"""The mlx tier: for each tiny generated architecture mlx-lm has a class for, a mixed plan
exported with ``export --format mlx`` loads in ``mlx_lm.load``, generates, and mlx-lm's logits
agree with the workbench's in-process evaluation of the same plan.

"In process" is two facts, each checked: (1) the folder's tensors, read back by the mlx loader
(exactly as mx.dequantize computes them), equal the workbench's own dequantization of the plan
(workbench.running.methods_apply.runner_weights: what `check` swaps into the network) to within
the rounding of the model's dtype; (2) transformers on those tensors and mlx-lm on the folder
(float32 models, so both run in float32) give the same next-token distributions. Measured
(64 random tokens; mean / max KL, same top-1): llama 2.1e-5 / 7.7e-5, 98.4 %; qwen3 3.3e-5 /
1.8e-4, 100 %; qwen3_moe 1.9e-5 / 9.4e-5, 100 %; mixtral 5.1e-6 / 4.1e-5, 100 %; phi3 1.4e-5 /
9.9e-5, 100 % (the tiny models' heads are scaled 8x for peaked distributions, which magnifies
float32 summation-order differences); gemma3_text (6 layers) 2.8e-7 / 9.8e-6, 100 %. In bfloat16 the same llama differs by a mean KL of 0.035:
mlx-lm then computes in bfloat16."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

pytestmark = pytest.mark.runtime

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install -e .[mlx])")
mlx_lm = pytest.importorskip("mlx_lm", reason="mlx-lm is not installed (pip install -e .[mlx])")

from tests.mlx_folders import tiny_hf  # noqa: E402
from tests.tiny_archs import available  # noqa: E402

ARCHS = ["llama", "gemma3_text", "qwen3", "qwen3_moe", "mixtral", "phi3"]
#: config overrides: mlx-lm's Gemma 3 places its global layer by sliding_window_pattern (6),
#: which needs as many layers (transformers' layer_types put the full-attention layer there too)
OVERRIDES = {"gemma3_text": {"num_hidden_layers": 6}}


def _export_formats():
    import workbench as qw
    return qw.export_formats()


@pytest.fixture(scope="module")
def has_mlx_export():
    if "mlx" not in _export_formats():
        pytest.skip("this build has no export --format mlx")


def _plan():
    """A mixed plan: 4-bit g64 by default, the MLP's down projections at 8 bits, the
    attention's values at 3 bits g32 (names as every tiny architecture spells them)."""
    import workbench as qw
    return qw.make_plan("mlx-q4-g64", rules=[("re:.*down_proj.*|.*\\.w2\\..*", "mlx-q8-g64"),
                                             ("re:.*v_proj.*", "mlx-q3-g32")])


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_plan_runs_in_mlx_lm_as_in_process(arch, tmp_path, has_mlx_export):
    if arch not in available():
        pytest.skip(f"transformers cannot build {arch}")
    import torch
    import transformers

    import workbench as qw
    from workbench.api import export_plan
    from workbench.export.convert.mlx_hf import write_mlx_hf
    from workbench.formats.loaders import open_model
    from workbench.core.progress import run
    from workbench.running.methods_apply import runner_weights
    hf = tiny_hf(arch, tmp_path / "hf", dtype="float32", **OVERRIDES.get(arch, {}))
    model = qw.open_model(str(hf))
    plan = _plan()
    folder = tmp_path / "mlx"
    export_plan(model, plan, "mlx", str(folder), progress=False)
    # (1) the folder's values are the in-process dequantization of the plan
    back = open_model(folder)
    ours = runner_weights(model, plan, "mlx")
    quantized = [n for n in back.tensors if back.info(n).quant]
    assert quantized, "nothing was quantized"
    for n in back.tensors:
        if ".switch_mlp." in n or n not in model.tensors:
            continue
        got = back.read(n)
        want = ours[n] if n in ours else model.read(n)
        np.testing.assert_allclose(got, np.asarray(want, np.float32).reshape(got.shape),
                                   rtol=1e-2, atol=1e-3 * float(np.abs(got).max() or 1),
                                   err_msg=n)
    # (2) mlx-lm and transformers on the same tensors
    with contextlib.redirect_stdout(io.StringIO()):
        net, tok = mlx_lm.load(str(folder))
        text = mlx_lm.generate(net, tok, prompt="hello world", max_tokens=4)
    assert isinstance(text, str)
    deq = tmp_path / "deq"
    run(write_mlx_hf(back, deq, "f32"))
    ids = np.random.default_rng(0).integers(0, 512, (1, 64))
    tnet = transformers.AutoModelForCausalLM.from_pretrained(str(deq), dtype=torch.float32)
    with torch.no_grad():
        lt = torch.log_softmax(tnet(torch.from_numpy(ids)).logits[0].double(), -1)
    lm = torch.log_softmax(torch.from_numpy(
        np.array(net(mx.array(ids.astype(np.int32))).astype(mx.float32))[0]).double(), -1)
    kl = (lt.exp() * (lt - lm)).sum(-1)
    top1 = float((lt.argmax(-1) == lm.argmax(-1)).double().mean())
    print(f"{arch}: mean KL {float(kl.mean()):.3g}, max {float(kl.max()):.3g}, "
          f"same top-1 {100 * top1:.1f} %")
    assert float(kl.mean()) < 1e-4
    assert top1 >= 0.95
