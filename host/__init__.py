"""Host package of the BFP NPU: number formats, BFP tensors and the bit-exact reference model.

The contract shared with the gateware (formats, layouts, enums) lives here and is imported
by ``hw`` and ``sim``; this package never imports them.
"""
