"""Generator for issue 47's cache class: every case is a JSON spec that tests/fuzz/hostile_caches.py
carries out on a fresh cache folder (workbench.core.cache) through the readers the project uses:

    r5-caches  an entry of one cache (the generic Cache, check's KLD cache, llama.cpp's base
               logits, the output measure's values) damaged after it was written: truncated,
               extended, bytes flipped or zeroed (mtime put back or not), another entry's
               payload or record copied over it, its record's key / size / checksum changed,
               the record garbage, missing, a link, a FIFO or a folder; the reader must give
               the original payload or a miss (and the damaged entry removed), never other
               data; a neighbour entry is still served intact.
"""

from __future__ import annotations

import json
import random

KINDS = ["generic", "kld", "base", "output"]
DAMAGES = ["truncate", "extend", "flip", "flip", "zero", "foreign", "foreign-record",
           "wrong-key", "record-bytes", "record-checksum", "record-garbage", "record-missing",
           "payload-missing", "payload-link", "payload-fifo", "payload-dir", "none"]


def r5_caches(r: random.Random):
    return "case.json", json.dumps({
        "kind": r.choice(KINDS), "damage": r.choice(DAMAGES), "pos": r.random(),
        "count": r.choice([1, 1, 2, 8, 64]), "keep_mtime": r.random() < 0.5,
        "garbage": r.choice(["", "{", "[]", "null", "{\"format\": 1}", "\x00" * 64, "x" * 5000]),
        "rows": r.randint(1, 40), "width": r.randint(1, 12), "seed": r.randint(0, 10**6)}).encode()


GENERATORS = {"r5-caches": r5_caches}
