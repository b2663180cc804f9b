"""The model zoo: small models trained with PyTorch and exported to ONNX.

Scripts and data, not part of the installed packages: ``python -m zoo.train`` retrains and
re-exports everything (it needs the ``train`` extra); the exported files under
``zoo/<model>/seed<k>/`` are committed so that tests and the demo need neither training nor
PyTorch. See ``zoo/README.md``.
"""
