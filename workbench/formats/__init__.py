"""Formats in: the lazy model (tensors by name), the loaders of safetensors, PyTorch, GGUF and
compressed-tensors checkpoints, dtype decoding, the architecture catalog, llama.cpp's tensor names
and the config.json checks.

Below quantization: it may use schemes (to decode a GGUF's quantized tensors), never above.
"""
