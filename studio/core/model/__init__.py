"""Open checkpoints lazily and describe their tensors: ``open_model(path) -> Checkpoint``.

``Checkpoint.info`` (a ``ModelInfo``) is known from headers and config.json alone; tensor data is read
only by ``Checkpoint.read`` / ``read_torch`` / ``read_raw``.
"""

from studio.core.model.checkpoint import (
    Checkpoint,
    GGUFCheckpoint,
    PickleCheckpoint,
    SafetensorsCheckpoint,
    hub_repo_id,
    open_model,
    resolve_model_path,
)
from studio.core.model.pickle_loader import PickleOptions
from studio.core.modelinfo import CheckpointFormat, ModelInfo, Role, TensorInfo

__all__ = [
    "Checkpoint",
    "CheckpointFormat",
    "GGUFCheckpoint",
    "ModelInfo",
    "PickleCheckpoint",
    "PickleOptions",
    "Role",
    "SafetensorsCheckpoint",
    "TensorInfo",
    "hub_repo_id",
    "open_model",
    "resolve_model_path",
]
