"""Amaranth gateware of the BFP NPU.

Every width and layout comes from ``host`` (``host.formats``, ``host.config``), so the
gateware, the reference model and the host agree by construction.
"""
