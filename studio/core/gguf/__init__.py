"""GGUF, the format alone: reading (bounded), the atomic writer and llama.cpp's tensor order, metadata,
vocabulary, the architecture tables and the layout dispatch (``layout``: which mapping names a
checkpoint's tensors in GGUF). The export pipeline that uses them is ``studio.core.export``. Import the
submodules (``read``, ``writer``, ``arch``, ``layout`` …); the package itself imports nothing, so
reading a GGUF does not pull in gguf-py's tables.
"""
