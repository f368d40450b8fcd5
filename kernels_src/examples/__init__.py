"""Example kernels written in the DSL, each with a host wrapper and a torch reference.

    vector_add  elementwise add, masked tail
    softmax     row-wise softmax, one pass when the row fits a block, else an online-max loop
    rmsnorm     RMSNorm with a fused residual add
    matmul      tiled GEMM with mt.dot over a K loop, optional bias + activation epilogue
    matmul_tma  the same GEMM with its A and B blocks loaded by TMA through tensor descriptors
    attention   causal attention forward with an online softmax over K/V blocks
    cumsum      row-wise inclusive prefix sum carried across blocks
"""
