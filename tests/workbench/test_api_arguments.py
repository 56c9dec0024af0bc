"""The Python API checks its arguments before it works (workbench/api/args.py): a wrong type is a
TypeError, a bad value a ValueError, both WorkbenchErrors whose message starts with the
parameter's name and says what is taken; nothing is a bare AttributeError / IndexError, and
nothing is guessed (a folder of several GGUFs, a float for a Budget)."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest

import workbench as qw
from workbench.core.checks import ArgumentError, ArgumentTypeError
from workbench.core.errors import WorkbenchError


@pytest.fixture(scope="module")
def demo():
    return qw.open_model()


def _refused(call, param, kind=WorkbenchError, text=None):
    with pytest.raises(kind) as info:
        call()
    msg = str(info.value)
    assert msg.startswith(param + " ") or f": {param} " in msg, msg
    assert "\n" not in msg
    if text:
        assert text in msg, msg
    return info.value


def test_every_public_function_checks_every_parameter():
    from workbench import api
    for name in sorted(qw._API):
        fn = getattr(api, name)
        if inspect.isfunction(fn):
            params = set(inspect.signature(fn).parameters)
            assert set(getattr(fn, "checks", {})) == params, name


def test_issue_47s_api_cases_are_named_refusals(demo, tmp_path):
    name = next(iter(demo.tensors))
    e = _refused(lambda: qw.allocate_plan(demo, 4.5), "budget", TypeError,
                 "qw.Budget.bits_per_weight(4.5)")
    assert isinstance(e, WorkbenchError) and e.param == "budget"
    _refused(lambda: qw.allocate_plan(demo, qw.Budget.bits_per_weight(4.5), pins=[name]),
             "pins", TypeError, "dict")
    _refused(lambda: qw.evaluate_plan("path", "q8_0"), "model", TypeError,
             "qw.open_model('path')")
    _refused(lambda: qw.diff_quantizations("a.json", "b.json", source=123), "source", TypeError)
    _refused(lambda: qw.make_plan("q8_0", rules=[("x",)]), "rules", TypeError, "('x',)")
    _refused(lambda: qw.convert_gguf("g.gguf", "gguf", None), "output", TypeError)
    _refused(lambda: qw.check_plan(demo, "q8_0", scoring="bogus"), "scoring", ValueError,
             "chunks, lines")
    assert not (tmp_path / "None").exists()


def test_numbers_are_range_checked_with_their_bounds(demo):
    _refused(lambda: qw.compute_frontier(demo, from_bpw=math.nan), "from_bpw", ValueError,
             "at most 1024")
    _refused(lambda: qw.compute_frontier(demo, to_bpw=math.inf), "to_bpw", ValueError)
    _refused(lambda: qw.compute_frontier(demo, points=1_000_000), "points", ValueError,
             "from 1 to 256")
    _refused(lambda: qw.compute_frontier(demo, from_bpw=5.0, to_bpw=4.0), "to_bpw",
             ValueError, "start of the range, 5")
    _refused(lambda: qw.check_plan(demo, "q8_0", samples=-2), "samples", ValueError,
             "from 1 to 1,000,000")
    _refused(lambda: qw.allocate_plan(demo, qw.Budget.bits_per_weight(4.5), samples=-3),
             "samples", ValueError)
    _refused(lambda: qw.check_plan(demo, "q8_0", ctx=2), "ctx", ValueError, "from 4 to")
    _refused(lambda: qw.check_plan(demo, "q8_0", chunks=0), "chunks", ValueError)
    _refused(lambda: qw.check_plan(demo, "q8_0", samples=2.0), "samples", TypeError)
    _refused(lambda: qw.check_plan(demo, "q8_0", samples=True), "samples", TypeError)
    _refused(lambda: qw.convert_gguf("g.gguf", "hf", "out", off_grid=-1), "off_grid",
             ValueError)
    _refused(lambda: qw.export_plan(demo, "q8_0", "onnx", "x.onnx", act_bits=64), "act_bits",
             ValueError, "from 2 to 16")


def test_wrong_types_and_choices(demo):
    _refused(lambda: qw.evaluate_plan(demo, 5), "plan", TypeError, "qw.make_plan")
    _refused(lambda: qw.evaluate_plan(demo, "q8_0", strict="yes"), "strict", TypeError)
    _refused(lambda: qw.evaluate_plan(demo, "q8_0", target="tensorrt"), "target", ValueError,
             "llama.cpp")
    _refused(lambda: qw.statistics(demo, "abc"), "names", TypeError, "list")
    _refused(lambda: qw.statistics(demo, progress=3), "progress", TypeError, "callable")
    _refused(lambda: qw.statistics(demo, progress=True), "progress", TypeError, "or False")
    _refused(lambda: qw.open_model(123), "path", TypeError)
    _refused(lambda: qw.open_model("x\0y"), "path", ValueError)
    _refused(lambda: qw.measure_sensitivity(demo, schemes=""), "schemes", ValueError)
    _refused(lambda: qw.compute_frontier(demo, recipes="Q4_K_M"), "recipes", TypeError)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        qw.evaluate_plan(demo, "q8_0", bogus=1)


def test_numpy_numbers_are_taken(demo):
    t = qw.statistics(demo, [next(iter(demo.tensors))])
    assert len(t) == 1
    from workbench.api.args import RULES
    RULES["samples"]("samples", np.int64(3))       # an index-like integer passes
    with pytest.raises(ArgumentTypeError):
        RULES["samples"]("samples", np.float64(3.0))


def test_make_plan_parses_a_plan_document_or_refuses():
    p = qw.make_plan(plan={"format": "quant-workbench-plan", "version": 1, "default": "q8_0",
                           "rules": [{"match": "a", "scheme": "q4_0"}]})
    assert isinstance(p, qw.Plan) and p.default == "q8_0" and p.rules[0].scheme == "q4_0"
    with pytest.raises(WorkbenchError, match="plan: unsupported plan version"):
        qw.make_plan(plan={"default": "q8_0"})
    _refused(lambda: qw.make_plan(plan=[1]), "plan", TypeError, "plan document")


def test_convert_gguf_takes_an_opened_model_by_its_file(demo, tmp_path):
    # the demo model is no GGUF: the refusal names its file, not the Model's repr
    with pytest.raises(WorkbenchError, match="model.safetensors: convert reads a GGUF file"):
        qw.convert_gguf(demo, "gguf", tmp_path / "x.gguf")


def _gguf(path):
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("blk.0.ffn_up.weight", np.ones((4, 32), np.float32))
    for step in (w.write_header_to_file, w.write_kv_data_to_file, w.write_tensors_to_file,
                 w.close):
        step()


def test_a_folder_of_several_ggufs_is_refused_listing_them(tmp_path):
    for n in ("a.gguf", "b.gguf", "c.gguf", "d.gguf"):
        _gguf(tmp_path / n)
    with pytest.raises(WorkbenchError, match=r"holds 4 GGUF files \(a.gguf, b.gguf, c.gguf, "
                                             r"d.gguf\): open one of them by its path"):
        qw.open_model(tmp_path)
    assert qw.open_model(tmp_path / "c.gguf").tensors      # named: that one
    one = tmp_path / "one"
    one.mkdir()
    _gguf(one / "m.gguf")
    assert list(qw.open_model(one).tensors) == ["blk.0.ffn_up.weight"]   # the only one


def test_argument_errors_survive_pickling_and_renaming():
    import pickle
    e = ArgumentError("samples", "is -2: give a whole number from 1 to 1,000,000")
    f = pickle.loads(pickle.dumps(e.named("--samples")))
    assert type(f) is ArgumentError and f.param == "samples"
    assert str(f) == "--samples is -2: give a whole number from 1 to 1,000,000"
    t = pickle.loads(pickle.dumps(ArgumentTypeError("budget", "must be a Budget")))
    assert isinstance(t, TypeError) and isinstance(t, WorkbenchError)


def test_fuzz_findings_a_long_name_and_an_empty_plan(demo, tmp_path):
    # found by the api-args fuzz kind: open_model's existence test raised OSError
    # (ENAMETOOLONG), and an empty plan name was blamed on make_plan's `scheme`
    from workbench.formats.loaders import open_model
    with pytest.raises(WorkbenchError, match=r"cannot open it \(File name too long\)"):
        open_model(tmp_path / ("x" * 5000))          # the loader itself (the CLI's door)
    _refused(lambda: qw.open_model(tmp_path / ("x" * 5000)), "path", ValueError,
             "longer than a file name can be")
    _refused(lambda: qw.export_plan(demo, "", "plan", tmp_path / "p.json"), "plan",
             ValueError, "is empty")
    assert not (tmp_path / "p.json").exists()
    _refused(lambda: qw.diff_quantizations("x" * 5000, "b.json"), "a", ValueError,
             "longer than a file name can be")


# ---- library errors in the API's terms; the CLI says its flags ------------------------------
def test_an_error_names_parameters_and_the_cli_tells_them_as_flags():
    import pickle
    e = WorkbenchError("measure='fisher' runs the calibration inputs: give calib=, not "
                       "imatrix=; ctx=4096 is too long; strict=True: 2 tensors; calibrate=3",
                       path="m.gguf", params=("measure", "calib", "imatrix", "ctx", "strict"))
    flags = {"measure": "--measure", "calib": "--calib", "ctx": "--ctx", "strict": "--strict"}
    told = pickle.loads(pickle.dumps(e)).flagged(flags.get)   # (a cluster worker's error)
    assert str(told) == ("m.gguf: --measure fisher runs the calibration inputs: give --calib, "
                         "not imatrix=; --ctx 4096 is too long; --strict: 2 tensors; "
                         "calibrate=3")              # no flag: as it was; a longer name: kept
    assert str(e.with_context(tensor="t").flagged(flags.get)).startswith(
        "m.gguf: tensor 't': --measure fisher")
    assert WorkbenchError("plain", params=()).flagged(flags.get).problem == "plain"


def test_methods_refused_by_the_api_and_by_the_cli(demo_model_path, tmp_path, capsys):
    from workbench.cli import main
    model = qw.open_model(demo_model_path)
    with pytest.raises(WorkbenchError, match=r"^methods='rtn,foo': unknown or unsupported "
                                             r"method 'foo' \(choose from rtn, imatrix, gptq\)$"):
        qw.allocate_plan(model, qw.Budget.bits_per_weight(5.0), methods="rtn,foo")
    assert main(["allocate", str(demo_model_path), "--budget-bpw", "5", "--methods", "rtn,foo",
                 "-o", str(tmp_path / "p.json")]) == 2
    assert capsys.readouterr().err.strip() == (
        "quant-workbench: error: --methods rtn,foo: unknown or unsupported method 'foo' "
        "(choose from rtn, imatrix, gptq)")



def test_check_refuses_another_runtimes_options_by_either_door(demo_model_path, tmp_path,
                                                                capsys):
    from workbench.cli import main
    model = qw.open_model(demo_model_path)
    out = str(tmp_path / "kept.gguf")
    for kw, api_says, argv, cli_says in (
            ({"save_gguf": out}, "save_gguf= needs runtime='llama.cpp'",
             ["--scheme", "q8_0", "--save-gguf", out], "--save-gguf needs --runtime llama.cpp"),
            ({"accuracy_level": 0}, "accuracy_level=, activations= and save_onnx= need "
             "runtime='onnxruntime'", ["--scheme", "q8_0", "--accuracy-level", "0"],
             "--accuracy-level, --activations and --save-onnx need --runtime onnxruntime"),
            ({"mlx_folder": str(tmp_path)}, "mlx_folder= needs runtime='mlx'",
             ["--mlx-folder", str(tmp_path)], "--mlx-folder needs --runtime mlx"),
            ({"runtime": "onnxruntime", "target": "vllm"},
             "runtime='onnxruntime' runs the rules of target='onnxruntime', not vllm",
             ["--scheme", "q8_0", "--runtime", "onnxruntime", "--target", "vllm"],
             "--runtime onnxruntime runs the rules of --target onnxruntime, not vllm")):
        with pytest.raises(WorkbenchError) as info:
            qw.check_plan(model, "q8_0", driver=lambda job: pytest.fail("work started"), **kw)
        assert str(info.value) == api_says
        assert main(["check", str(demo_model_path), *argv]) == 2
        assert capsys.readouterr().err.strip() == f"quant-workbench: error: {cli_says}"
    assert not (tmp_path / "kept.gguf").exists()
