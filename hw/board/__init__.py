"""Board tops: the simulated board (link and core on a byte stream) and the ULX3S-85F top
with its build (``python -m hw.board``, ``docs/link-hw.md``)."""
