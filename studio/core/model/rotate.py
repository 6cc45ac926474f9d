"""Rotations folded into the weights (QuaRot/SpinQuant's R1 and R2): a view over a checkpoint.

R1 rotates the residual stream by an orthogonal ``Q``: RMSNorm commutes with ``Q`` once its scale is
folded into the matrices that read it, so the embedding becomes ``E·Q``, every reader of a norm
``W·diag(s)·Q`` (q/k/v, gate/up, the MoE router, the head), every writer into the stream ``Qᵀ·W``
(o_proj, down; a bias ``b·Q``) and the norms all ones. R2 rotates each attention head's values by
``R2`` (v_proj's rows per KV head, o_proj's input columns per query head: one matrix per layer, so
query heads sharing a KV head see the same rotation). The function is unchanged up to rounding, the
tensors keep their names and shapes, and stock llama.cpp runs the file. A tied head is untied: it
becomes its own tensor (``lm_head.weight``), since the head carries the final norm's scale.

``RotatedCheckpoint`` produces each tensor rotated when it is read (one tensor at a time; the only
extra memory is ``Q``, ``hidden²`` float32), so export, the imatrix, the scan, AWQ and GPTQ see the
rotated model without knowing about it.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from studio.core.errors import StudioError
from studio.core.model.checkpoint import Checkpoint
from studio.core.modelinfo import ModelInfo, Role, TensorInfo

ROTATABLE = ("llama", "mistral", "qwen2", "qwen3", "phi3")
"""Model types whose rotation the studio folds and writes itself."""

# why each other family is refused, in one sentence
_REFUSED = {
    "gemma": "llama.cpp's Gemma always reads its output head from the embedding, so the final norm "
    "cannot be folded into an untied head",
    "gemma2": "Gemma 2 normalises each block's output (post-norms), which a residual rotation cannot fold",
    "gemma3_text": "Gemma 3 normalises each block's output (post-norms), which a residual rotation cannot "
    "fold",
    "olmo2": "OLMo 2 normalises each block's output (post-norms), which a residual rotation cannot fold",
    "gpt2": "GPT-2's LayerNorm subtracts the mean and adds a bias, which this rotation does not fold yet",
    "bert": "BERT's LayerNorm subtracts the mean and adds a bias, which this rotation does not fold yet",
}

_INPUT_NORM = re.compile(r"\.input_layernorm\.weight$")
_POST_NORM = re.compile(r"\.post_attention_layernorm\.weight$")
_FINAL_NORM = re.compile(r"(?:^|\.)norm\.weight$")
_HEAD_NORM = re.compile(r"self_attn\.[qk]_norm\.weight$")  # inside a head: untouched by R1

_ATTN_READERS = (Role.ATTN_Q, Role.ATTN_K, Role.ATTN_V, Role.ATTN_QKV)
_FFN_READERS = (Role.FFN_GATE, Role.FFN_UP, Role.FFN_GATE_UP, Role.FFN_ROUTER, Role.FFN_GATE_EXPS,
                Role.FFN_UP_EXPS)  # fmt: skip
_WRITERS = (Role.ATTN_OUT, Role.FFN_DOWN, Role.FFN_DOWN_EXPS)


ROTATION_CONFIG_KEY = "_quant_studio_rotation"
"""Where a rotated view's config carries its ``quantize.rotation.*`` metadata (no HF config uses it)."""
_RIGHT_VALUES = 1 << 22  # values Rotor.right rotates at once (16 MB of float32 per temporary)


class RotationError(StudioError):
    """A model cannot be rotated, or its rotation does not compute the same function."""


@dataclass(frozen=True)
class Rotation:
    """Which rotations to fold and the seed that draws them."""

    seed: int = 0
    r1: bool = True
    r2: bool = True

    def metadata(self, hidden: int, head_dim: int) -> dict[str, Any]:
        """The ``quantize.rotation.*`` keys that record this rotation in a GGUF file."""
        return {
            "quantize.rotation.method": "randomized-hadamard",
            "quantize.rotation.seed": int(self.seed),
            "quantize.rotation.r1": bool(self.r1),
            "quantize.rotation.r2": bool(self.r2),
            "quantize.rotation.r1_size": int(hidden),
            "quantize.rotation.r2_size": int(head_dim),
        }


# ------------------------------------------------------------------------------------------ matrices


def hadamard(n: int) -> np.ndarray:
    """The Sylvester Walsh–Hadamard matrix of order ``n`` (a power of two), scaled to be orthogonal."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard order {n} is not a power of two")
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def random_orthogonal(n: int, rng: np.random.Generator) -> np.ndarray:
    """A Haar-random orthogonal matrix of order ``n`` (QR of a Gaussian, signs fixed by R's diagonal)."""
    q, r = np.linalg.qr(rng.standard_normal((n, n)))
    return q * np.sign(np.diag(r))


@dataclass(frozen=True)
class Rotor:
    """A randomised Hadamard rotation ``Q = diag(signs)·(H ⊗ R)`` of order ``len(signs)``, kept as its
    factors: ``right(x) = x·Q`` costs ``n·(2^k + m)`` per row instead of ``n²``."""

    signs: np.ndarray  # (n,) ±1
    h: np.ndarray  # (2^k, 2^k) orthogonal Walsh–Hadamard
    r: np.ndarray  # (m, m) orthogonal, m odd

    @property
    def n(self) -> int:
        """The order of the rotation."""
        return len(self.signs)

    def matrix(self) -> np.ndarray:
        """``Q`` itself (float64): for tests and small orders."""
        return self.signs[:, None] * np.kron(self.h, self.r)

    def right(self, x: np.ndarray) -> np.ndarray:
        """``x·Q`` over the last axis of ``x`` (float32 in, float32 out), into a new array a block of rows at
        a time: whole, a 151,936-row head held two temporaries of its size at once (0.93 GB each on the 1.5B)."""
        x = np.asarray(x, dtype=np.float32)
        n, k, m = self.n, self.h.shape[0], len(self.r)
        flat = x.reshape(-1, n)
        out = np.empty(flat.shape, dtype=np.float32)
        signs, ht, r = self.signs.astype(np.float32), self.h.T.astype(np.float32), self.r.astype(np.float32)
        step = max(1, _RIGHT_VALUES // n)
        for a in range(0, len(flat), step):
            # row index a·m + b: (x·(H ⊗ R))[c·m + d] = Σ x[a, b]·H[a, c]·R[b, d] = (Hᵀ·X·R)[c, d]
            y = np.matmul(ht, (flat[a : a + step] * signs).reshape(-1, k, m))
            out[a : a + step] = np.matmul(y, r).reshape(-1, n)
        return out.reshape(x.shape)


def rotor(n: int, seed: int, salt: int = 0) -> Rotor:
    """A randomised Hadamard rotation of order ``n``: ``diag(±1)·(H_{2^k} ⊗ R_m)`` with ``n = 2^k·m``,
    ``m`` odd and ``R_m`` a seeded random orthogonal matrix (identity when ``m = 1``).

    Every entry of the Hadamard factor has the same magnitude, so one outlier channel is spread over
    ``2^k`` channels; the small odd factor only mixes within its ``m`` (576 = 64·9, 1536 = 512·3).
    """
    rng = np.random.default_rng([int(seed), int(salt), int(n)])
    k = (n & -n).bit_length() - 1  # largest power of two dividing n
    m = n >> k
    r = random_orthogonal(m, rng) if m > 1 else np.ones((1, 1))
    signs = rng.choice(np.array([-1.0, 1.0]), size=n)
    return Rotor(signs, hadamard(1 << k), r)


def rotation_matrix(n: int, seed: int, salt: int = 0) -> np.ndarray:
    """``rotor(n, seed, salt)`` as a dense float64 matrix."""
    return rotor(n, seed, salt).matrix()


# ------------------------------------------------------------------------------------------ support


def refusal(info: ModelInfo) -> str | None:
    """Why ``info`` cannot be rotated (one sentence), or None when it can."""
    mt = str(info.model_type).lower()
    if getattr(info.format, "value", info.format) == "gguf":
        return (
            "Rotation is folded into a Hugging Face folder's float weights; open a GGUF original through its "
            "converted folder (gguf_source.hf_folder_for), as export --rotate and the Export dialog do."
        )
    if mt in _REFUSED:
        return f"Rotation is not available for {mt}: {_REFUSED[mt]}."
    if mt not in ROTATABLE:
        return f"Rotation does not cover model type {mt!r} yet (it covers {', '.join(ROTATABLE)})."
    for t in info.tensors:
        if t.role in _WRITERS + _ATTN_READERS + _FFN_READERS and len(t.shape) == 3:
            return f"Rotation does not cover fused 3-D expert tensors such as {t.name} yet."
        if t.role is Role.NORM and t.name.endswith(".bias"):
            return f"Rotation does not fold a norm with a bias ({t.name})."
    return None


def check_rotatable(info: ModelInfo) -> None:
    """Raise ``RotationError`` (one sentence) when ``info`` cannot be rotated."""
    why = refusal(info)
    if why:
        raise RotationError(why)


def dims(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(hidden, heads, kv heads, head dim) of a decoder config."""
    hidden = int(config["hidden_size"])
    n_head = int(config.get("num_attention_heads") or 1)
    n_kv = int(config.get("num_key_value_heads") or n_head)
    head_dim = int(config.get("head_dim") or hidden // n_head)
    return hidden, n_head, n_kv, head_dim


# ------------------------------------------------------------------------------------------ the view


class RotatedCheckpoint(Checkpoint):
    """``inner`` with R1 (and R2) folded in: every tensor is produced rotated, in float32, when read.

    A tied head becomes ``lm_head.weight`` of its own (``untied_bytes`` says what it adds as float32)
    and the config says ``tie_word_embeddings: false``.
    """

    def __init__(self, inner: Checkpoint, rotation: Rotation) -> None:
        info = inner.info
        check_rotatable(info)
        self.inner = inner
        self.rotation = rotation
        cfg = dict(info.config)
        self.hidden, self.n_head, self.n_kv, self.head_dim = dims(cfg)
        names = {t.name for t in info.tensors}
        self._embed = next((t for t in info.tensors if t.role is Role.TOKEN_EMBD), None)
        if self._embed is None:
            raise RotationError(f"{info.path.name} has no token embedding to rotate.")
        self._final_norm = next(
            (t.name for t in info.tensors if t.layer is None and _FINAL_NORM.search(t.name)), None
        )
        if self._final_norm is None:
            raise RotationError(f"{info.path.name} has no final norm to fold.")
        tensors = []
        for t in info.tensors:
            self._classify(t)  # refuse a block tensor whose place in the stream is unknown
            tensors.append(dataclasses.replace(t, dtype="F32", nbytes=4 * t.n_elements))
        self.untied = not any(t.role is Role.OUTPUT for t in info.tensors)
        self.head_name = "lm_head.weight"
        if self.untied:
            if self.head_name in names:
                raise RotationError(f"{info.path.name} has an {self.head_name} that is not the head.")
            e = self._embed
            tensors.append(
                dataclasses.replace(
                    e, name=self.head_name, role=Role.OUTPUT, dtype="F32", nbytes=4 * e.n_elements
                )
            )
        else:
            self.head_name = next(t.name for t in info.tensors if t.role is Role.OUTPUT)
        cfg["tie_word_embeddings"] = False
        cfg[ROTATION_CONFIG_KEY] = rotation.metadata(self.hidden, self.head_dim)
        super().__init__(dataclasses.replace(info, config=cfg, tensors=tuple(tensors)))
        self._q: Rotor | None = None
        self._r2: dict[int, np.ndarray] = {}

    @property
    def untied_bytes(self) -> int:
        """Float32 bytes of the head this view adds by untying it (0 when the model had its own)."""
        return 4 * self._embed.n_elements if self.untied else 0

    # -- matrices (cached: R1 as its factors, R2 head_dim² per layer)
    def q(self) -> Rotor | None:
        """R1 (None when R1 is off)."""
        if self._q is None and self.rotation.r1:
            self._q = rotor(self.hidden, self.rotation.seed)
        return self._q

    def _right(self, x: np.ndarray) -> np.ndarray:
        """``x·Q`` over the last axis."""
        q = self.q()
        return np.asarray(x, dtype=np.float32) if q is None else q.right(x)

    def r2(self, layer: int) -> np.ndarray:
        """R2 of block ``layer`` as float32 (the identity when R2 is off)."""
        if layer not in self._r2:
            d = self.head_dim
            r = rotation_matrix(d, self.rotation.seed, salt=1 + layer) if self.rotation.r2 else np.eye(d)
            self._r2[layer] = r.astype(np.float32)
        return self._r2[layer]

    # -- what each tensor is
    def _classify(self, t: TensorInfo) -> str:
        if t.role is Role.TOKEN_EMBD:
            return "embed"
        if t.role is Role.OUTPUT:
            return "head"
        if t.role is Role.NORM:
            if _HEAD_NORM.search(t.name):
                return "keep"
            if _INPUT_NORM.search(t.name) or _POST_NORM.search(t.name) or t.name == self._final_norm:
                return "norm"
        elif t.role in _ATTN_READERS or t.role in _FFN_READERS:
            # a q/k/v bias is on the output side: R1 leaves it, R2 turns v's
            return "reader" if t.name.endswith(".weight") else "bias"
        elif t.role in _WRITERS:
            return "writer"
        elif t.role is Role.OTHER and len(t.shape) <= 1 and t.layer is None:
            return "keep"  # a buffer (rotary inv_freq)
        if t.role is Role.OTHER and t.name.endswith("rotary_emb.inv_freq"):
            return "keep"
        raise RotationError(f"Rotation does not know where {t.name} sits in the residual stream.")

    def _norm_of(self, t: TensorInfo) -> str:
        """The norm whose output ``t`` reads."""
        if t.role is Role.OUTPUT:
            return self._final_norm
        which = "input_layernorm" if t.role in _ATTN_READERS else "post_attention_layernorm"
        name = f"model.layers.{t.layer}.{which}.weight"
        if name not in self.inner:
            raise RotationError(f"Rotation cannot find the norm {name} that {t.name} reads.")
        return name

    # -- reading
    def _rotated(self, t: TensorInfo) -> np.ndarray:
        kind = "head" if t.name == self.head_name else self._classify(self.inner.info.tensor(t.name))
        if kind == "keep":
            return np.asarray(self.inner.read(t.name), dtype=np.float32)
        if kind == "norm":
            return np.ones(t.shape, dtype=np.float32)
        if kind == "bias":
            return self._r2_values(t, np.asarray(self.inner.read(t.name), dtype=np.float32)[:, None])[:, 0]
        if kind == "embed":
            return self._right(self.inner.read(t.name))
        if kind == "head":
            w = _scaled(
                self.inner.read(self._embed.name if self.untied else t.name), self.inner, self._final_norm
            )
            return self._right(w)
        if kind == "reader":
            return self._r2_values(
                t, self._right(_scaled(self.inner.read(t.name), self.inner, self._norm_of(t)))
            )
        # writer: Qᵀ·W = (Wᵀ·Q)ᵀ (a bias b·Q); o_proj's input columns per head ·R2
        w = self.inner.read(t.name)
        if w.ndim == 1:
            return self._right(w)
        w = self._right(np.ascontiguousarray(w.T)).T
        if t.role is Role.ATTN_OUT and t.layer is not None:
            d = self.head_dim
            w = (w.reshape(w.shape[0], -1, d) @ self.r2(t.layer)).reshape(w.shape)
        return np.ascontiguousarray(w)

    def _r2_values(self, t: TensorInfo, w: np.ndarray) -> np.ndarray:
        """v_proj's rows (or the v part of a fused qkv) per KV head: R2ᵀ·W_h."""
        if t.layer is None or t.role not in (Role.ATTN_V, Role.ATTN_QKV):
            return w
        d = self.head_dim
        r2t = self.r2(t.layer).T
        if t.role is Role.ATTN_V:
            return (r2t @ w.reshape(-1, d, w.shape[-1])).reshape(w.shape)
        v0 = (self.n_head + self.n_kv) * d  # fused q, k, v rows
        w = w.copy()
        w[v0:] = (r2t @ w[v0:].reshape(-1, d, w.shape[-1])).reshape(-1, w.shape[-1])
        return w

    def _read_f32(self, t: TensorInfo) -> np.ndarray:
        return np.ascontiguousarray(self._rotated(t), dtype=np.float32)

    def _read_raw(self, t: TensorInfo) -> np.ndarray:
        return self._read_f32(t)

    def _map_raw(self, t: TensorInfo) -> np.ndarray:
        return self._read_f32(t)

    def _read_torch(self, t: TensorInfo) -> Any:
        import torch

        return torch.from_numpy(self._read_f32(t))

    def close(self) -> None:
        """Close the checkpoint underneath as well."""
        self.inner.close()
        super().close()


def _scaled(w: np.ndarray, inner: Checkpoint, norm: str) -> np.ndarray:
    """``w`` with its input columns scaled by the norm ``norm``'s weights, in place where ``w`` is a writable
    float32 array of its own (``read`` gives a new one), else in a copy."""
    w = w if w.dtype == np.float32 and w.flags.writeable and w.flags.c_contiguous else np.array(w, np.float32)
    w *= inner.read(norm)[None, :]
    return w


MAX_SEED = 2**32 - 1


def rotation_from(rotate: bool, seed: int = 0) -> Rotation | None:
    """The rotation a face asked for (None without ``rotate``); a seed outside 0..2³²−1 is refused."""
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise RotationError(f"The rotation seed must be a whole number from 0 to {MAX_SEED}, not {seed!r}.")
    return Rotation(seed=seed) if rotate else None


def rotation_metadata(info: ModelInfo) -> dict[str, Any]:
    """The ``quantize.rotation.*`` keys to write for ``info`` (empty unless it is a rotated view)."""
    meta = info.config.get(ROTATION_CONFIG_KEY)
    return dict(meta) if isinstance(meta, dict) else {}


def rotation_of(info: ModelInfo) -> Rotation | None:
    """The rotation a rotated view's ``info`` was made with (None for a model as it is): the scan, the
    imatrix and the held-out judgement of a rotated plan reopen the model through it."""
    meta = rotation_metadata(info)
    if not meta:
        return None
    return Rotation(
        seed=int(meta["quantize.rotation.seed"]),
        r1=bool(meta["quantize.rotation.r1"]),
        r2=bool(meta["quantize.rotation.r2"]),
    )


def rotation_key(rotation: Rotation | None) -> dict[str, Any]:
    """What a cache key adds for ``rotation`` (nothing without one, so unrotated keys stay as they were)."""
    if rotation is None:
        return {}
    return {"rotation": [int(rotation.seed), bool(rotation.r1), bool(rotation.r2)]}


def rotated(inner: Checkpoint, rotation: Rotation | None) -> Checkpoint:
    """``inner`` seen through ``rotation`` (``inner`` itself when ``rotation`` is None)."""
    return inner if rotation is None else RotatedCheckpoint(inner, rotation)
