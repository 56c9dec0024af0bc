"""Per-tensor work, for the app (app/ reads the domain through workbench.api and workbench.core
only: the import contract in pyproject.toml): statistics, one scheme's evaluation of a tensor
and its estimate, the totals, the dequantizing kernels (the window's throughput column), and the
executors the per-tensor jobs run on."""

from workbench.jobs.cluster import is_plain, open_executor, parse_spec, prefetch_evaluations
from workbench.planning.estimate import MIN_ELEMENTS, can_estimate, estimate_tensor
from workbench.quant import accel
from workbench.quant.evaluate import DEFAULT_EVAL_CACHE, evaluate, evaluate_tensor, quantize, totals_of
from workbench.quant.metrics import sqnr_db
from workbench.quant.stats import DEFAULT_CACHE, model_stats, tensor_stats

__all__ = ["DEFAULT_CACHE", "DEFAULT_EVAL_CACHE", "MIN_ELEMENTS", "accel", "can_estimate",
           "estimate_tensor", "evaluate", "evaluate_tensor", "is_plain", "model_stats",
           "open_executor", "parse_spec", "prefetch_evaluations", "quantize", "sqnr_db",
           "tensor_stats", "totals_of"]
