"""The export pipeline: a plan and a source (Hugging Face folder or GGUF original) become a GGUF file.

``run`` streams the Hugging Face → GGUF export (the studio's own converter, llama.cpp's converter route
or llama.cpp's quantizer), ``requantize`` turns a GGUF original into another GGUF, ``verify`` loads the
result in llama.cpp and compares its logits with the original. Import the submodules; the package
itself imports nothing.
"""
