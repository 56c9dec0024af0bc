"""``check --runtime mlx``: an mlx-lm folder judged against the float model, in torch on the long
text and in mlx-lm itself on a short one.

mlx's Linux CPU backend is slow (a 512-token forward of SmolLM2-135M takes about 45 s in
bfloat16 and 140 s in float32 on two shared cores), so the figures come in two parts:

1. **the long text, in torch** (the figures under ``"kld"``, the same keys as the in-process
   ``check``): the folder's tensors dequantized exactly as ``mx.dequantize`` computes them
   (workbench.formats.loaders.mlx_format, through ``convert``'s float32 Hugging Face folder,
   workbench.export.convert.mlx_hf), swapped into the float model's network and scored by
   workbench.running.kld: chunks of ``ctx`` tokens, the second half of each scored, as
   ``llama-perplexity --kl-divergence`` does; the float model's distributions cached there.
2. **mlx-lm's own forward** (``"mlx"``) on the first ``mlx_chunks`` chunks of the same text:
   ``mlx_lm.load(folder)`` and ``model(tokens)``, as mlx-lm runs the folder (its own dtypes),
   against mlx-lm's float forward of the float model in float32 (``"kld"``: the same figures
   and statistics, workbench.running.kld's sparse KLD); beside it, on the same tokens,
   ``"torch_kld"`` (the torch path of part 1 on those tokens) and ``"agreement"``: the full KL
   divergence between transformers' and mlx-lm's next-token distributions, ``"float"`` (both
   in float32, the float model) and ``"quantized"`` (transformers on the dequantized
   tensors in float32, mlx-lm on the folder as it loads it).

The float side of part 2 (mlx-lm's and transformers' float distributions, sparse as
workbench.running.kld caches them, and the float agreement) is cached (workbench.core.cache),
keyed by the float model's content, the token ids, K and S, and the versions of mlx, mlx-lm,
torch and transformers; on a hit only the folder runs.

The folder is the user's (``folder``), or the plan exported with ``export --format mlx`` into
a temporary folder. The float model is a Hugging Face folder mlx-lm can load (a GGUF: convert
it first).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from workbench.core.errors import WorkbenchError
from workbench.core.progress import Progress

DEFAULT_MLX_CHUNKS = 1
CACHE_VERSION = 1


def folder_bytes(folder) -> int:
    """The bytes of an mlx-lm folder's safetensors files (what --budget-of counts: those its
    model is read from, formats.loaders.weight_files)."""
    from workbench.formats.loaders import weight_files
    return sum(f.stat().st_size for f in weight_files(folder))


def check_folder(folder) -> Path:
    """`folder` as an mlx-lm folder mlx-lm can load: config.json with mlx's "quantization",
    its safetensors; else a WorkbenchError naming it."""
    from workbench.formats.loaders.mlx_format import mlx_quantization
    p = Path(folder)
    if not p.is_dir():
        raise WorkbenchError("not a folder (an mlx-lm folder: config.json, safetensors, "
                             "tokenizer)", path=str(p))
    if mlx_quantization(p) is None:
        raise WorkbenchError("config.json has no mlx \"quantization\" object: not a quantized "
                             "mlx-lm folder", path=str(p / "config.json"))
    folder_bytes(p)
    return p


def check_float_model(model) -> Path:
    """The float model's folder, which mlx-lm must load: a Hugging Face folder (not a GGUF, not
    a quantized mlx folder) whose model_type mlx-lm has a class for."""
    from workbench.formats.llama_names import model_folder
    if model.format == "gguf":
        raise WorkbenchError("mlx-lm runs Hugging Face folders: convert the GGUF first "
                             "(convert --to hf)", path=model.path)
    if model.format == "mlx":
        raise WorkbenchError("the float model is a quantized mlx-lm folder: give the float "
                             "model (convert makes one of it)", path=model.path)
    folder = model_folder(model)
    cfg = folder / "config.json"
    try:
        model_type = json.loads(cfg.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        raise WorkbenchError("no readable config.json", path=str(cfg)) from None
    import importlib.util
    try:
        from mlx_lm.utils import MODEL_REMAPPING
    except ImportError:
        raise WorkbenchError("runtime='mlx' needs mlx and mlx-lm (pip install -e .[mlx])",
                             params=("runtime",)) from None
    name = MODEL_REMAPPING.get(model_type, model_type)
    if not isinstance(name, str) or importlib.util.find_spec(f"mlx_lm.models.{name}") is None:
        raise WorkbenchError(f"mlx-lm has no model class for model_type {model_type!r}",
                             path=str(cfg))
    return folder


# ---- the forwards --------------------------------------------------------------------------
def mlx_logprobs(folder, grid: np.ndarray, rows: range, float32: bool = False) -> np.ndarray:
    """float64 log-probs (n_chunk * len(rows), vocab) of mlx-lm's forward of `folder` on each
    chunk of `grid`, at the positions `rows` (``float32``: the model cast to float32 first)."""
    import mlx.core as mx
    import mlx_lm
    with contextlib.redirect_stdout(io.StringIO()):
        net, _ = mlx_lm.load(str(folder))
    if float32:
        net.set_dtype(mx.float32)
    out = []
    for row in grid:
        z = net(mx.array(row[None].astype(np.int32)))[0, rows.start:rows.stop]
        z = np.array(z.astype(mx.float32), dtype=np.float64)
        out.append(z - _logsumexp(z))
    return np.concatenate(out)


def torch_logprobs(folder, grid: np.ndarray, rows: range) -> np.ndarray:
    """The same of transformers' forward of the Hugging Face `folder` in float32."""
    import torch
    import transformers
    net = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    net.eval()
    out = []
    with torch.no_grad():
        for row in grid:
            z = net(torch.from_numpy(row[None].astype(np.int64))).logits[0, rows.start:rows.stop]
            out.append(torch.log_softmax(z.double(), -1).numpy())
    return np.concatenate(out)


def _logsumexp(z: np.ndarray) -> np.ndarray:
    m = z.max(-1, keepdims=True)
    return m + np.log(np.exp(z - m).sum(-1, keepdims=True))


# ---- the figures ---------------------------------------------------------------------------
def agreement(la: np.ndarray, lb: np.ndarray) -> dict:
    """Full KL(a || b) per token of two log-prob arrays: mean, 99.9 %, max, same top-1 (%)."""
    from workbench.running.kld import percentile
    kl = np.sort(np.maximum((np.exp(la) * (la - lb)).sum(-1), 0.0))
    return {"mean": float(kl.mean()), "p999": percentile(kl, 0.999), "max": float(kl[-1]),
            "same_top1": float(100.0 * (la.argmax(-1) == lb.argmax(-1)).mean()),
            "tokens": int(len(kl))}


def sparse_of(lb: np.ndarray, nxt: np.ndarray, k: int, ns: int) -> dict:
    """workbench.running.kld's cached form of the float log-probs `lb` (ids, logp, tail, nll)."""
    import torch

    from workbench.running.kld import sparse_base
    t = torch.from_numpy(lb)
    ids, vals, tail = sparse_base(t, k, ns, torch.Generator().manual_seed(0))
    return {"ids": ids.numpy().astype(np.int64), "logp": vals.float().numpy(),
            "tail": tail.float().numpy(),
            "nll": (-t.gather(-1, torch.from_numpy(nxt)[:, None])[:, 0]).float().numpy()}


def figures(base: dict, lq: np.ndarray, nxt: np.ndarray, n_chunk: int, ctx: int, k: int,
            ns: int) -> dict:
    """llama-perplexity's figures (workbench.running.kld) of `lq` against the sparse `base`."""
    import torch

    from workbench.running.kld import _figures, sparse_kld
    tq = torch.from_numpy(lq)
    kld = sparse_kld(torch.from_numpy(base["ids"]), torch.from_numpy(base["logp"]).double(),
                     torch.from_numpy(base["tail"]).double(), tq, k).numpy()
    acc = {"kld": kld, "same": lq.argmax(-1) == base["ids"][:, 0],
           "nll_b": base["nll"].astype(np.float64),
           "nll_q": (-tq.gather(-1, torch.from_numpy(nxt)[:, None])[:, 0]).float().numpy()}
    return _figures(acc, n_chunk, ctx, k, ns)["kld"]


# ---- the float side's cache ----------------------------------------------------------------
def _versions() -> list:
    import importlib.metadata as md
    return [[p, md.version(p)] for p in ("mlx", "mlx-lm", "torch", "transformers")]


def float_key(model, grid: np.ndarray, k: int, ns: int) -> str:
    from workbench.core.cache import make_key, model_key
    tok = hashlib.sha256(np.ascontiguousarray(grid, np.int64).tobytes()).hexdigest()
    return make_key(["mlx-float", CACHE_VERSION, model_key(model), tok, list(grid.shape), k, ns,
                     _versions()])


def _cache():
    from workbench.core.cache import Cache
    from workbench.running.kld import CACHE_KEEP, cache_dir
    return Cache("kld", ".safetensors", CACHE_KEEP, folder=cache_dir())


def read_float(key: str, n_rows: int, width: int, vocab: int) -> dict | None:
    """The cached float side ({"mlx": base, "torch": base, "agreement": {...}}), None on a miss
    (or an entry that fails its checks: removed)."""
    blob = _cache().get_bytes(key)
    if blob is None:
        return None
    try:
        from safetensors.numpy import load
        d = load(blob)
        meta = json.loads(_metadata(blob)["agreement"])
        out = {"agreement": meta}
        for side in ("mlx", "torch"):
            b = {f: d[f"{side}.{f}"] for f in ("ids", "logp", "tail", "nll")}
            ok = (b["ids"].shape == (n_rows, width) and b["logp"].shape == (n_rows, width)
                  and b["tail"].shape == (n_rows,) and b["nll"].shape == (n_rows,)
                  and not (n_rows and (b["ids"].min() < 0 or b["ids"].max() >= vocab))
                  and np.isfinite(b["logp"]).all() and np.isfinite(b["nll"]).all())
            if not ok:
                raise ValueError(side)
            b["ids"] = b["ids"].astype(np.int64)
            out[side] = b
    except Exception:  # noqa: BLE001 - an unreadable entry is a miss, rewritten afterwards
        _cache().remove(key)
        return None
    return out


def _metadata(blob: bytes) -> dict:
    n = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + n]).get("__metadata__", {})


def write_float(key: str, sides: dict) -> bool:
    from safetensors.numpy import save
    arrays = {}
    for side in ("mlx", "torch"):
        b = sides[side]
        arrays.update({f"{side}.ids": np.ascontiguousarray(b["ids"], np.int32),
                       f"{side}.logp": np.ascontiguousarray(b["logp"], np.float32),
                       f"{side}.tail": np.ascontiguousarray(b["tail"], np.float32),
                       f"{side}.nll": np.ascontiguousarray(b["nll"], np.float32)})
    blob = save(arrays, metadata={"agreement": json.dumps(sides["agreement"])})
    return _cache().put_bytes(key, blob)


# ---- the job -------------------------------------------------------------------------------
def check_mlx(model, plan, text, ctx: int | None = None, *, chunks: int | None = None,
              folder=None, mlx_chunks: int = DEFAULT_MLX_CHUNKS, mlx_ctx: int | None = None,
              quant_model=None, use_cache: bool = True):
    """Job for ``check --runtime mlx`` (the module doc): the mlx-lm `folder`, or `plan`
    exported with ``export --format mlx`` (from `quant_model` when given: the model with the
    plan's methods applied), judged against the float `model` on `text` (mlx-lm on chunks of
    `mlx_ctx` tokens, default `ctx`: its quantized matmuls are slower still). Returns
    workbench.running.kld's figures (the long text, in torch) with "runtime", "folder",
    "bytes", "mlx" (mlx-lm's own forward on the first `mlx_chunks` chunks) and "seconds"."""
    from workbench.export.convert.mlx_hf import write_mlx_hf
    from workbench.export.convert.hf import waiting
    from workbench.formats.loaders import open_model
    from workbench.running import kld as K
    if mlx_chunks < 1:
        raise WorkbenchError(f"mlx_chunks {mlx_chunks}: run at least one chunk in mlx-lm")
    float_folder = check_float_model(model)
    if folder is not None:
        folder = check_folder(folder)
    else:
        from workbench.export import list_exporters
        if "mlx" not in {e.name for e in list_exporters()}:
            raise WorkbenchError("this build has no mlx export (export --format mlx): give an "
                                 "mlx-lm folder instead of a plan")
    seconds: dict = {}
    with tempfile.TemporaryDirectory(prefix="qw-check-mlx-") as tmp:
        tmp = Path(tmp)
        if folder is None:
            from workbench.export import export
            folder = tmp / "plan-mlx"
            t0 = time.perf_counter()
            yield Progress(0, 1, "exporting the plan to an mlx-lm folder")
            yield from export(quant_model or model, plan, "mlx", folder)
            seconds["export"] = round(time.perf_counter() - t0, 2)
        qmodel = open_model(folder)
        try:
            deq = tmp / "dequantized-hf"
            t0 = time.perf_counter()
            yield from write_mlx_hf(qmodel, deq, "f32")
            seconds["dequantize"] = round(time.perf_counter() - t0, 2)
        finally:
            qmodel.close()
        _same_tensors(model, deq)
        dmodel = open_model(deq)
        try:
            weights = {n: None for n in dmodel.tensors}
            res = yield from K.kld_check(model, None, text, ctx=ctx, chunks=chunks,
                                         weights=_Lazy(dmodel, weights), use_cache=use_cache)
        finally:
            dmodel.close()
        seconds["torch"] = res["kld"]["seconds"]
        ctx = mlx_ctx or res["kld"]["ctx"]
        # part 2: mlx-lm's own forward on the first chunks of the same text
        ids, bos = K.text_stream(model, text, ctx * mlx_chunks + 1)
        grid = K.make_chunks(ids, ctx, bos, mlx_chunks)
        if not len(grid):
            grid = K.make_chunks(ids, len(ids), bos, 1)
        n_chunk, cctx = grid.shape
        rows = K.scored_positions(cctx)
        nxt = grid[:, rows.start + 1:rows.stop + 1].reshape(-1)
        from workbench.running.calibration import vocab_size
        vocab = vocab_size(model)
        k, ns = res["kld"]["top_k"], res["kld"]["tail_samples"]
        key = float_key(model, grid, k, ns) if use_cache else None
        n_rows = n_chunk * len(rows)
        cached = read_float(key, n_rows, k + ns, vocab) if use_cache else None
        if cached is None:
            t0 = time.perf_counter()
            mf = yield from waiting(lambda: mlx_logprobs(float_folder, grid, rows, True),
                                    f"mlx-lm: the float model in float32, {n_chunk} chunk(s)")
            tf = yield from waiting(lambda: torch_logprobs(float_folder, grid, rows),
                                    "transformers: the float model in float32")
            cached = {"mlx": sparse_of(mf, nxt, k, ns), "torch": sparse_of(tf, nxt, k, ns),
                      "agreement": agreement(tf, mf)}
            del mf, tf
            seconds["mlx_float"] = round(time.perf_counter() - t0, 2)
            state = "written" if use_cache and write_float(key, cached) else (
                "off" if not use_cache else "miss")
        else:
            state = "hit"
        t0 = time.perf_counter()
        mq = yield from waiting(lambda: mlx_logprobs(folder, grid, rows),
                                f"mlx-lm: the folder as it loads, {n_chunk} chunk(s)")
        seconds["mlx"] = round(time.perf_counter() - t0, 2)
        tq = yield from waiting(lambda: torch_logprobs(deq, grid, rows),
                                "transformers: the dequantized tensors in float32")
        mlx = {"chunks": n_chunk, "ctx": int(cctx), "tokens": n_rows, "float_cache": state,
               "kld": figures(cached["mlx"], mq, nxt, n_chunk, cctx, k, ns),
               "torch_kld": figures(cached["torch"], tq, nxt, n_chunk, cctx, k, ns),
               "agreement": {"float": cached["agreement"], "quantized": agreement(tq, mq)}}
        nbytes = folder_bytes(folder)
        out_folder = str(folder) if folder.parent != tmp else None
    yield Progress(1, 1, "done")
    return {**res, "runtime": "mlx", "folder": out_folder, "bytes": nbytes, "mlx": mlx,
            "seconds": seconds}


def _tied(model) -> bool:
    from workbench.formats.llama_names import model_folder
    try:
        cfg = json.loads((model_folder(model) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return bool(cfg.get("tie_word_embeddings", (cfg.get("text_config") or {}).get(
        "tie_word_embeddings", False)))


class _Lazy(dict):
    """{name: float32 tensor} of a model, read when asked (kld_check's `weights`)."""

    def __init__(self, model, names):
        super().__init__(names)
        self._model = model

    def __getitem__(self, name):
        return self._model.read(name)


def _same_tensors(model, deq: Path) -> None:
    """The folder's tensors are the float model's (names and shapes), or a WorkbenchError."""
    from workbench.formats.loaders import open_model
    d = open_model(deq)
    try:
        for n, info in model.tensors.items():
            got = d.tensors.get(n)
            if got is None:
                if n == "lm_head.weight" and _tied(model):
                    continue        # (a tied head stored twice: mlx-lm drops it)
                raise WorkbenchError("the float model's tensor is not in the mlx-lm folder: "
                                     "is it a quantization of this model?", path=model.path,
                                     tensor=n)
            if tuple(got.shape) != tuple(info.shape):
                raise WorkbenchError(f"the mlx-lm folder's tensor is {list(got.shape)}, the "
                                     f"float model's {list(info.shape)}: is it a quantization "
                                     "of this model?", path=model.path, tensor=n)
    finally:
        d.close()
