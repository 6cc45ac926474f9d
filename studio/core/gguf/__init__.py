"""GGUF: reading (bounded), Hugging Face → GGUF conversion (architecture map, vocabulary, metadata), the
streamed export and the atomic writer. Import the submodules (``read``, ``export``, ``arch``, ``writer``
…); the package itself imports nothing, so reading a GGUF does not pull in gguf-py's tables.
"""
