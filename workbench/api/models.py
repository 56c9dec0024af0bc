"""A checkpoint's structure, for the app (app/ reads the domain through workbench.api and
workbench.core only: the import contract in pyproject.toml): the model and its tensors, its
config, its mixture-of-experts groups, llama.cpp's tensor names, a GGUF source run live, the
streaming safetensors writer, the default calibration text. ``qw.open_model`` opens one."""

from workbench.export.convert.live import open_live, wants_live
from workbench.export.st_writer import StreamingSafetensorsWriter
from workbench.formats.catalog import expert_index, grouping, moe_role
from workbench.formats.llama_names import gguf_names
from workbench.formats.model import Model, TensorInfo
from workbench.formats.moe_selectors import parse_selector
from workbench.running.calibration import DEFAULT_CALIB
from workbench.running.moe import expert_groups, expert_spread
from workbench.running.runner_config import model_kind, read_config

__all__ = ["DEFAULT_CALIB", "Model", "StreamingSafetensorsWriter", "TensorInfo", "expert_groups",
           "expert_index", "expert_spread", "gguf_names", "grouping", "model_kind", "moe_role",
           "open_live", "parse_selector", "read_config", "wants_live"]
