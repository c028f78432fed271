"""The linear scan h_t = a_t·h_{t-1} + b_t and the dense RNN scan.

``chunked``: the pure-torch reference (``*_ref``) and the chunked torch path, ``triton``: the Triton kernel (imported on use by :mod:`dynlab.kernels.dispatch`).
"""

from .chunked import default_chunk, dense_rnn_ref, dense_rnn_scan, linear_scan, linear_scan_ref

__all__ = ["default_chunk", "dense_rnn_ref", "dense_rnn_scan", "linear_scan", "linear_scan_ref"]
