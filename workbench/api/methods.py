"""The weight-rounding methods (RTN, imatrix, GPTQ, AWQ) and their comparison on one layer, for
the app (app/ reads the domain through workbench.api and workbench.core only: the import contract
in pyproject.toml). ``tensor_stats`` here is a layer's calibration statistics (the inputs the
methods weigh by), not workbench.api.tensors' weight statistics."""

from workbench.quant.methods import get_method, intq, list_methods
from workbench.quant.methods.base import METHOD_NAMES
from workbench.running.methods_compare import applies, evaluate_method, peers_of, tensor_stats

__all__ = ["METHOD_NAMES", "applies", "evaluate_method", "get_method", "intq", "list_methods",
           "peers_of", "tensor_stats"]
