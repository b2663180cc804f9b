"""Amaranth gateware of the BFP NPU.

Every width and layout comes from ``host`` (``host.spec.formats``, ``host.spec.config``), so the
gateware, the reference model and the host agree by construction.
"""
