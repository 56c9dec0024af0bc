"""Running models: transformers models built from a workbench model, calibration text, forward passes
and their measures (activation statistics, Fisher, output checks), the methods applied with
calibration, MoE routing, the ONNX graph, imatrix files and in-process KL divergence.
"""
