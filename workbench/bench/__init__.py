"""Benchmarks and figure-making: the measurements behind docs/benchmarks.md and the methods'
figures (not used by the app or the other commands).

* ``throughput`` — `quant-workbench bench`: dequantize/quantize throughput per scheme;
* ``ggml``     — `bench --vs-ggml`: the GGML quantizers against ggml's own C code;
* ``llama``    — `bench --vs-llama-quantize`: exports against llama-quantize;
* ``load``     — `bench-load`: loading and statistics of a generated checkpoint;
* ``minilm_figures``, ``synthetic_figures`` — the calibration-aware methods' tables;
* ``docs``     — `python -m workbench.bench.docs`: regenerates docs/benchmarks.md.

The GUI benchmark (`bench-gui`) is app/bench_gui.py: it needs Qt, which workbench/ never imports.
"""
