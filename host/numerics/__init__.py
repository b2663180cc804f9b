"""The bit-exact arithmetic kernels: BFP tensors (:mod:`.bfp`), FP16 element-wise
arithmetic (:mod:`.fp16`), unary function tables (:mod:`.unary`), reductions
(:mod:`.reduction`) and the matrix-vector arithmetic: vector quantizer, BFP-long
accumulation, FP16 conversion, overflow counts (:mod:`.mvm`).

These define the numerics of ``docs/numerics.md``; the gateware computes the same integers.
"""
