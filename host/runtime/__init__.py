"""Talking to a device: the device API (:mod:`.device`), the transports and their registry
(:mod:`.transport`), the protocol server over the reference model (:mod:`.server`) and
progress reporting (:mod:`.progress`)."""
