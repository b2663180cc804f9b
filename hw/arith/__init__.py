"""Arithmetic building blocks: the FP16 units of the MFUs (binary, unary, reduction) and
the ECP5 multiplier helpers."""
