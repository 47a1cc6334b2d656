"""Attention kernels: reference, pure-PyTorch block-sparse, SDPA, flash-attn and Triton backends."""
