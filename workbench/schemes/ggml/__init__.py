"""GGML block formats (llama.cpp / GGUF), byte-compatible with ggml.

| scheme | weights/block | bytes/block | bits/weight |
|--------|---------------|-------------|-------------|
| q4_0   | 32  | 18  | 4.5    |
| q4_1   | 32  | 20  | 5.0    |
| q5_0   | 32  | 22  | 5.5    |
| q5_1   | 32  | 24  | 6.0    |
| q8_0   | 32  | 34  | 8.5    |
| q2_k   | 256 | 84  | 2.625  |
| q3_k   | 256 | 110 | 3.4375 |
| q4_k   | 256 | 144 | 4.5    |
| q5_k   | 256 | 176 | 5.5    |
| q6_k   | 256 | 210 | 6.5625 |
| iq4_nl | 32  | 18  | 4.5    |
| mxfp4  | 32  | 17  | 4.25   |
| tq1_0  | 256 | 54  | 1.6875 |
| tq2_0  | 256 | 66  | 2.0625 |
| iq4_xs | 256 | 136 | 4.25   |
| iq3_xxs | 256 | 98 | 3.0625 |
| iq3_s  | 256 | 110 | 3.4375 |
| iq2_xxs | 256 | 66 | 2.0625 |
| iq2_xs | 256 | 74 | 2.3125 |
| iq2_s  | 256 | 82 | 2.5625 |
| iq1_s  | 256 | 50 | 1.5625 |
| iq1_m  | 256 | 56 | 1.75   |
| nvfp4  | 64  | 36  | 4.5    |

Every scheme stores ``{"blocks": uint8 (rows, cols/QK * bytes_per_block)}``: exactly the
bytes a GGUF file holds for the tensor. Importing this package registers the schemes.
"""

from __future__ import annotations

from workbench.schemes.ggml.common import GGMLScheme
from workbench.schemes.ggml.iq1 import IQ1_M, IQ1_S
from workbench.schemes.ggml.iq3 import IQ3_S, IQ3_XXS
from workbench.schemes.ggml.iq2 import IQ2_S, IQ2_XS, IQ2_XXS
from workbench.schemes.ggml.iq4_nl import IQ4_NL
from workbench.schemes.ggml.iq4_xs import IQ4_XS
from workbench.schemes.ggml.mxfp4 import MXFP4
from workbench.schemes.ggml.nvfp4 import NVFP4
from workbench.schemes.ggml.legacy import Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
from workbench.schemes.ggml.q2_k import Q2_K
from workbench.schemes.ggml.q3_k import Q3_K
from workbench.schemes.ggml.q4_k import Q4_K
from workbench.schemes.ggml.q5_k import Q5_K
from workbench.schemes.ggml.q6_k import Q6_K
from workbench.schemes.ggml.tq import TQ1_0, TQ2_0

GGML_SCHEMES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
                "iq4_nl", "mxfp4", "tq1_0", "tq2_0", "iq4_xs",
                "iq3_xxs", "iq3_s", "iq2_xxs", "iq2_xs", "iq2_s", "nvfp4",
                "iq1_s", "iq1_m")

__all__ = ["GGMLScheme", "GGML_SCHEMES", "IQ1_M", "IQ1_S", "IQ2_S", "IQ2_XS", "IQ2_XXS", "IQ3_S", "IQ3_XXS", "IQ4_NL", "IQ4_XS", "MXFP4", "NVFP4", "Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K",
           "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0", "TQ1_0", "TQ2_0", "ggml_scheme_for_type"]


def ggml_scheme_for_type(type_name: str) -> GGMLScheme | None:
    """The scheme for a GGML type name such as 'Q4_K' (None if not implemented here)."""
    from workbench.schemes.base import get_scheme
    key = str(type_name).lower()
    return get_scheme(key) if key in GGML_SCHEMES else None
