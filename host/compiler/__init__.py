"""From a network to what the device runs: the assembler (:mod:`.asm`) and the program
builder with its layers (:mod:`.programs`). The graph compiler, its passes and the export
of a program as NumPy belong here too."""
