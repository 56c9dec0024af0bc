"""Bit packing of small unsigned codes (a little-endian bit stream): one implementation, in
the kernel layer (``kernels.packing``), shared by the numpy references and the kernels."""

from kernels.packing import pack_bits, packed_nbytes, unpack_bits

__all__ = ["pack_bits", "packed_nbytes", "unpack_bits"]
