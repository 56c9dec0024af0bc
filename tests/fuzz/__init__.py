"""The project's own fuzz suite: mutated safetensors headers, GGUF files, PyTorch zips,
quantized-safetensors metadata, plans and sessions, each case run in a worker process under a
memory limit (1 GiB above the worker's own footprint) and a wall-clock limit (10 s).

Outcomes: a one-line WorkbenchError or a correct load is a pass; a traceback (any other
exception), a hang (time limit) or a memory blow-up (MemoryError under the limit, or the
worker killed) is a failure, reported with the case's bytes saved for reproduction.

    python -m tests.fuzz --minutes N [--seed S] [--area A]    # a longer run, counts per area
"""
