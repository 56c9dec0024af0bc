"""The per-tensor work on a real Dask cluster: a scheduler and two single-threaded workers
started as processes (`dask scheduler`, `dask worker`) on 127.0.0.1 once for the module.
Sweeps and a GGUF export through them equal the in-process results exactly; a worker killed
mid-run changes nothing; the scheduler gone is a one-line error with nothing written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parents[2]
DASK = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
WORKER = [sys.executable, "-m", "distributed.cli.dask_worker"]
SCHEMES = ["q4_0", "q4_k", "q8_0", "int4-g128"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["NUMBA_NUM_THREADS"] = "1"
    env.pop("QT_QPA_PLATFORM", None)
    return env


def _start_scheduler(tmp: Path):
    sf = tmp / f"scheduler-{time.monotonic_ns()}.json"
    proc = subprocess.Popen(DASK + ["--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                                    "--scheduler-file", str(sf)],
                            cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    for _ in range(300):
        if sf.exists():
            try:
                return proc, json.loads(sf.read_text())["address"]
            except (ValueError, KeyError):
                pass
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("dask scheduler did not start")


def _start_worker(address: str):
    return subprocess.Popen(WORKER + [address, "--nthreads", "1", "--nworkers", "1",
                                      "--no-dashboard", "--host", "127.0.0.1",
                                      "--death-timeout", "20"],
                            cwd=ROOT, env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def _wait_workers(address: str, n: int) -> None:
    from distributed import Client
    with Client(address, timeout=20) as c:
        c.wait_for_workers(n, timeout=120)


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(address, [worker processes]): a scheduler and two workers for the module."""
    tmp = tmp_path_factory.mktemp("dask")
    sched, address = _start_scheduler(tmp)
    workers = [_start_worker(address), _start_worker(address)]
    try:
        _wait_workers(address, 2)
        yield address, workers
    finally:
        _stop(workers + [sched])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A bf16 safetensors file of 24 matrices (row lengths that every candidate takes)."""
    import torch
    from safetensors.torch import save_file
    rng = np.random.default_rng(7)
    t = {}
    for i in range(6):
        for proj, shape in (("q_proj", (256, 256)), ("k_proj", (128, 256)),
                            ("up_proj", (512, 256)), ("down_proj", (256, 512))):
            w = rng.standard_normal(shape).astype(np.float32) * (0.02 + 0.01 * i)
            t[f"model.layers.{i}.{proj}.weight"] = torch.from_numpy(w).to(torch.bfloat16)
    t["model.norm.weight"] = torch.ones(256, dtype=torch.bfloat16)
    path = tmp_path_factory.mktemp("ckpt") / "model.safetensors"
    save_file(t, str(path))
    return path


def _executor(address):
    from workbench.jobs.cluster import open_executor
    return open_executor(address)


def _fresh_model(path):
    from workbench.quant.evaluate import DEFAULT_EVAL_CACHE
    from workbench.formats.loaders import open_model
    DEFAULT_EVAL_CACHE.clear()
    return open_model(path)


def test_parse_spec_refuses_bad_text():
    from workbench.jobs.cluster import parse_spec
    from workbench.core.errors import WorkbenchError
    assert parse_spec(None) == ("none", None)
    assert parse_spec("local") == ("local", None)
    assert parse_spec("local:3") == ("local", 3)
    assert parse_spec("tcp://10.0.0.5:8786") == ("address", "tcp://10.0.0.5:8786")
    for bad in ("local:0", "local:x", "tcp://nohost", "gpu-farm"):
        with pytest.raises(WorkbenchError, match="--cluster"):
            parse_spec(bad)


def test_cli_bad_cluster_value_is_exit_2(checkpoint, capsys):
    from workbench.cli import main
    assert main(["evaluate", str(checkpoint), "--scheme", "q8_0", "--cluster", "local:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("quant-workbench: error: --cluster local:0: the worker count after 'local:' "
                   "must be a whole number of at least 1")


def test_unreachable_scheduler_is_one_line():
    from workbench.jobs.cluster import ClusterExecutor, CONNECT_TIMEOUT
    from workbench.core.errors import WorkbenchError
    import workbench.jobs.cluster as wc
    old = wc.CONNECT_TIMEOUT
    wc.CONNECT_TIMEOUT = 2
    try:
        with pytest.raises(WorkbenchError, match="cannot reach the cluster tcp://127.0.0.1:9"):
            ClusterExecutor("address", "tcp://127.0.0.1:9")
    finally:
        wc.CONNECT_TIMEOUT = old
    assert CONNECT_TIMEOUT == old


def test_evaluate_equals_in_process(cluster, checkpoint):
    from workbench.quant.evaluate import EvalCache, evaluate
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    address, _ = cluster
    plan = Plan(default="q4_k")
    local = run(evaluate(_fresh_model(checkpoint), plan, cache=None))
    events = []
    with _executor(address) as ex:
        remote = run(evaluate(_fresh_model(checkpoint), plan, cache=EvalCache(), executor=ex),
                     events.append)
    assert list(remote.tensors) == list(local.tensors)
    for n, r in local.tensors.items():
        assert remote.tensors[n].to_dict() == r.to_dict(), n
    assert remote.totals.to_dict() == local.totals.to_dict()
    assert local.totals.sqnr_db > 10
    # progress came from the cluster's tasks and reached the end
    assert any("on tcp://" in e.message for e in events)
    assert events[-1].fraction == 1.0


def test_weight_sensitivity_table_equals_in_process(cluster, checkpoint):
    from workbench.core.progress import run
    from workbench.planning.sensitivity import sensitivity_table_job
    address, _ = cluster
    local = run(sensitivity_table_job(_fresh_model(checkpoint), SCHEMES, "weight"))
    with _executor(address) as ex:
        remote = run(sensitivity_table_job(_fresh_model(checkpoint), SCHEMES, "weight",
                                           executor=ex))
    assert remote.to_dict() == local.to_dict()
    assert len(local.names) == 24
    v = local.values
    assert v[("model.layers.5.up_proj.weight", "q4_0")] > v[("model.layers.5.up_proj.weight",
                                                           "q8_0")] > 0


def test_activation_sensitivity_equals_in_process(cluster, checkpoint):
    from workbench.core.progress import run
    from workbench.planning.sensitivity import activation_errors
    address, _ = cluster
    model = _fresh_model(checkpoint)
    rng = np.random.default_rng(3)
    moments = {n: rng.random(model.info(n).shape[1]).astype(np.float32) + 0.1
               for n in model.tensors if n.endswith("proj.weight")}
    local = run(activation_errors(model, SCHEMES, moments))
    with _executor(address) as ex:
        remote = run(activation_errors(_fresh_model(checkpoint), SCHEMES, moments, executor=ex))
    assert remote == local
    assert len(local) == 24 * len(SCHEMES) and min(local.values()) > 0


def _export(model, path, executor=None, scheme="q4_k"):
    from workbench.export import export
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    return run(export(model, Plan(default=scheme), "gguf", path, executor=executor))


def test_gguf_export_is_byte_identical(cluster, checkpoint, tmp_path):
    address, _ = cluster
    a, b = tmp_path / "local.gguf", tmp_path / "cluster.gguf"
    _export(_fresh_model(checkpoint), a)
    with _executor(address) as ex:
        info = _export(_fresh_model(checkpoint), b, ex)
    assert info["tensors"] == 25 and info["types"]["Q4_K"] == 24
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.gguf", "local.gguf"]


def test_cli_sensitivity_with_cluster_flag(cluster, checkpoint, capsys):
    from workbench.cli import main
    address, _ = cluster
    assert main(["sensitivity", str(checkpoint), "--schemes", "q4_0,q8_0", "--json"]) == 0
    local = json.loads(capsys.readouterr().out)
    assert main(["sensitivity", str(checkpoint), "--schemes", "q4_0,q8_0", "--json",
                 "--cluster", address]) == 0
    remote = json.loads(capsys.readouterr().out)
    local.pop("seconds"), remote.pop("seconds")
    assert remote == local


def test_worker_without_the_file_is_a_clear_error(cluster, tmp_path):
    """A path the workers cannot see: the task's WorkbenchError names the file and why."""
    from workbench.jobs.cluster import evaluate_task
    from workbench.core.errors import WorkbenchError
    address, _ = cluster
    gone = str(tmp_path / "gone.safetensors")
    with _executor(address) as ex:
        fut = ex.submit(evaluate_task, (gone, None), "w", [])
        with pytest.raises(WorkbenchError, match=r"gone\.safetensors: worker on .* cannot see") \
                as got:
            ex.result(fut)
    assert got.value.path == gone      # the error arrives whole: a caller's context() keeps it
    assert str(got.value.with_context(path="/elsewhere")).count("gone.safetensors") == 1


def test_killed_worker_reruns_tasks_identically(cluster, checkpoint, tmp_path):
    """SIGKILL one of the two workers while the export runs: its tasks run again on the other,
    the file equals the in-process one, nothing partial is left; a worker is started again."""
    address, workers = cluster
    a, b = tmp_path / "local.gguf", tmp_path / "cluster.gguf"
    _export(_fresh_model(checkpoint), a, scheme="q3_k")
    from workbench.export import export
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    killed = []

    def on_progress(ev):
        if not killed and ev.done > 0:
            workers[0].send_signal(signal.SIGKILL)
            workers[0].wait(10)
            killed.append(ev.done)

    with _executor(address) as ex:
        run(export(_fresh_model(checkpoint), Plan(default="q3_k"), "gguf", b, executor=ex),
            on_progress)
    assert killed, "the export finished before a worker could be killed"
    assert a.read_bytes() == b.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster.gguf", "local.gguf"]
    workers[0] = _start_worker(address)
    _wait_workers(address, 2)


def test_scheduler_gone_is_a_clear_error_and_nothing_written(checkpoint, tmp_path):
    from workbench.core.errors import WorkbenchError
    from workbench.export import export
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    sched, address = _start_scheduler(tmp_path)
    worker = _start_worker(address)
    out = tmp_path / "out" / "m.gguf"
    out.parent.mkdir()
    try:
        _wait_workers(address, 1)

        def on_progress(ev):
            if ev.done > 0 and sched.poll() is None:
                sched.kill()
                sched.wait(10)

        with _executor(address) as ex:
            with pytest.raises(WorkbenchError, match="scheduler is gone"):
                run(export(_fresh_model(checkpoint), Plan(default="q3_k"), "gguf", out,
                           executor=ex), on_progress)
        assert list(out.parent.iterdir()) == []
    finally:
        _stop([worker, sched])


def test_cancel_cancels_the_cluster_tasks(cluster, checkpoint):
    """Closing a sweep (the app's Cancel) cancels its tasks still on the cluster."""
    from workbench.core.errors import Cancelled
    from workbench.core.progress import run
    from workbench.planning.sensitivity import sensitivity_table_job
    address, _ = cluster
    with _executor(address) as ex:
        seen = []
        with pytest.raises(Cancelled):
            run(sensitivity_table_job(_fresh_model(checkpoint), ["q3_k", "q5_k", "q6_k"],
                                      "weight", executor=ex),
                lambda ev: seen.append(ev), lambda: len(seen) >= 1)
        # cancelled while the cluster still had tasks of the sweep (24 tensors x 3 K-quants)
        assert "tasks left" in seen[0].message and seen[0].fraction < 0.9
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            left = [k for k, s in ex.client.run_on_scheduler(
                lambda dask_scheduler: {str(k): t.state for k, t in
                                        dask_scheduler.tasks.items()}).items()]
            if not left:
                break
            time.sleep(0.1)
        assert left == []


class _Settings(dict):
    def value(self, key, default=None):
        return self.get(key, default)

    def setValue(self, key, value):
        self[key] = value


def test_app_setting_runs_the_sensitivity_table_on_the_cluster(cluster, checkpoint):
    """The app's preference (Tools > Compute on Cluster): bad text is refused and nothing
    stored; a scheduler address makes the app's table job run there, same figures."""
    from types import SimpleNamespace

    from app.cluster_setting import KEY, ClusterSetting
    from app.effects_jobs import table_job
    from workbench.core.errors import WorkbenchError
    from workbench.core.progress import run
    address, _ = cluster
    settings = _Settings()
    setting = ClusterSetting(settings)
    with pytest.raises(WorkbenchError, match="local:0"):
        setting.set_spec("local:0")
    assert KEY not in settings and setting.executor() is None
    local = run(table_job(_fresh_model(checkpoint), ["q4_0", "q8_0"], "weight"))
    assert setting.set_spec(address) == address and settings[KEY] == address
    events = []
    try:
        remote = run(table_job(_fresh_model(checkpoint), ["q4_0", "q8_0"], "weight",
                               runner=SimpleNamespace(cluster=setting)), events.append)
    finally:
        setting.close()
    assert remote.err == local.err and remote.nbytes == local.nbytes
    assert any(f"on {address}" in e.message for e in events)


def test_statistics_equal_in_process(cluster, checkpoint):
    from workbench.core.progress import run
    from workbench.quant.stats import StatsCache, model_stats
    address, _ = cluster
    local = run(model_stats(_fresh_model(checkpoint), cache=None))
    with _executor(address) as ex:
        remote = run(model_stats(_fresh_model(checkpoint), cache=StatsCache(), executor=ex))
    assert list(remote) == list(local)
    for n, st in local.items():
        a, b = st.to_dict(arrays=True), remote[n].to_dict(arrays=True)
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True), n
    assert local["model.layers.5.up_proj.weight"].to_dict()["std"] > 0.05


def test_compressed_tensors_export_is_byte_identical(cluster, checkpoint, tmp_path):
    """vLLM's folder: every quantized tensor computed on the workers, the same files."""
    pytest.importorskip("compressed_tensors")
    from workbench.export import export
    from workbench.quant.plan import Plan
    from workbench.core.progress import run
    address, _ = cluster
    a, b = tmp_path / "local", tmp_path / "cluster"
    run(export(_fresh_model(checkpoint), Plan(default="int4-g128"), "compressed-tensors", a))
    with _executor(address) as ex:
        run(export(_fresh_model(checkpoint), Plan(default="int4-g128"), "compressed-tensors", b,
                   executor=ex))
    files = sorted(p.name for p in a.iterdir())
    assert "model.safetensors" in files and sorted(p.name for p in b.iterdir()) == files
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert (a / "model.safetensors").stat().st_size < 24 * 256 * 512 // 2   # packed 4-bit
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cluster", "local"]


@pytest.mark.parametrize("arch,gguf_arch", [("qwen3_moe", "qwen3moe"), ("llama", "llama")])
def test_converted_gguf_export_is_byte_identical(cluster, tiny_arch, tmp_path, arch, gguf_arch):
    """Hugging Face folders the exporter converts, with the layout rebuilt on the workers from
    config.json: qwen3_moe's experts merged into one GGUF tensor (parts encoded there), llama's
    q/k rows permuted for llama.cpp's rope (the transform runs there)."""
    address, _ = cluster
    folder = tiny_arch(arch)
    a, b = tmp_path / "local.gguf", tmp_path / "cluster.gguf"
    info = _export(_fresh_model(folder), a, scheme="q8_0")
    with _executor(address) as ex:
        _export(_fresh_model(folder), b, ex, scheme="q8_0")
    assert info["architecture"] == gguf_arch and info["runnable_by_llama_cpp"]
    assert a.read_bytes() == b.read_bytes()


def test_missing_distributed_names_the_extra(monkeypatch):
    from workbench.jobs.cluster import open_executor
    from workbench.core.errors import WorkbenchError
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(WorkbenchError, match=r'pip install "quant-workbench\[cluster\]"'):
        open_executor("local:1")
    assert open_executor("") is None       # the in-process path needs nothing


def test_worker_refuses_a_different_file_at_the_path(tmp_path):
    """The worker side's check: another size at the client's path is refused by name; the
    same file is opened once and kept."""
    from workbench.jobs.cluster import worker_model
    from workbench.core.errors import WorkbenchError
    from workbench.quant.stats import file_signature
    import torch
    from safetensors.torch import save_file
    p = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(4, 8)}, str(p))
    sig = (str(p), file_signature(p))
    m = worker_model(sig)
    assert worker_model(sig) is m and list(m.tensors) == ["w"]
    stale = (str(p), (sig[1][0], sig[1][1] + 1))
    with pytest.raises(WorkbenchError, match=r"m\.safetensors: worker on .* different file"):
        worker_model(stale)
