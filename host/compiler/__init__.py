"""From a network to what the device runs: the assembler (:mod:`.asm`), the program
builder with its layers (:mod:`.programs`), and the network compiler: the graph IR
(:mod:`.ir`), the ONNX importer (:mod:`.onnx_import`), the lowering (:mod:`.lower`) and
the compiled network (:mod:`.network`: :func:`compile_onnx`, :class:`Network`). The
export of a program as NumPy belongs here too."""

__all__ = ["compile_onnx", "Network"]


def __getattr__(name):
    # Lazy, so that importing the assembler or the builder does not load the network
    # compiler (and the ONNX importer loads ``onnx`` only when it is used).
    if name in __all__:
        from host.compiler import network
        return getattr(network, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
