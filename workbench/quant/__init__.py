"""Quantization of one tensor at a time: plans (rules naming a scheme per tensor), what each runtime
applies (runtimes), the methods (rtn, GPTQ, AWQ, imatrix weighting), evaluating a scheme on a tensor
(error, size), streaming evaluation, tensor statistics, metrics and the bridge to the kernels (accel).

Needs no running model: everything here works from weights (and, for methods, from given
second moments). Jobs that want a cluster take an executor as an argument.
"""
