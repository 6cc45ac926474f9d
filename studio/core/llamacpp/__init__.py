"""llama.cpp (through llama-cpp-python) run in a child process; see ``worker.LlamaWorker``."""

from studio.core.llamacpp.worker import LlamaWorker

__all__ = ["LlamaWorker"]
