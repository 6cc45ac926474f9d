"""Rotations folded into the weights (QuaRot/SpinQuant's R1 and R2): a view over a checkpoint.

R1 rotates the residual stream by an orthogonal ``Q``: RMSNorm commutes with ``Q`` once its scale is
folded into the matrices that read it, so the embedding becomes ``E·Q``, every reader of a norm
``W·diag(s)·Q`` (q/k/v, gate/up, the MoE router, the head), every writer into the stream ``Qᵀ·W``
(o_proj, down; a bias ``b·Q``) and the norms all ones. LayerNorm (GPT-2) subtracts the mean first: its
``Q`` also maps the all-ones direction to itself (a Householder step after the Hadamard), so the mean
commutes too, and the norm's bias folds into the readers' biases (the final norm keeps ``(b/s)·Q``,
since llama.cpp's GPT-2 head has no bias). R2 rotates each attention head's values by
``R2`` (v_proj's rows per KV head, o_proj's input columns per query head: one matrix per layer, so
query heads sharing a KV head see the same rotation). The function is unchanged up to rounding, the
tensors keep their names and shapes, and stock llama.cpp runs the file. A tied head is untied: it
becomes its own tensor (``lm_head.weight``), since the head carries the final norm's scale.

Gemma, Gemma 2 and BERT get R2 alone (``R2_ONLY`` says why R1 cannot fold there); the file records
``quantize.rotation.r1 = false`` and the export says so.

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
from studio.core.modelinfo import ROTATION_CONFIG_KEY, ModelInfo, Role, TensorInfo, rotation_config

ROTATABLE = (
    *("llama", "mistral", "qwen2", "qwen3", "phi3", "gpt2", "gemma", "gemma2", "bert"),  # the studio writes
    *("gemma3_text", "olmo2", "mixtral", "qwen3_moe", "granite", "smollm3"),  # llama.cpp's converter writes
)
"""Model types whose rotation the studio folds (``R2_ONLY``'s with R2 alone)."""

R2_ONLY = {
    "gemma": "llama.cpp's Gemma always reads its output head from the embedding, so the final norm "
    "cannot be folded into an untied head",
    "gemma2": "Gemma 2 normalises each block's output (post-norms), and a post-norm's scale cannot be "
    "folded out of the residual stream",
    "gemma3_text": "Gemma 3 normalises each block's output (post-norms), and a post-norm's scale cannot be "
    "folded out of the residual stream",
    "olmo2": "OLMo 2 normalises each block's output (post-norms), and a post-norm's scale cannot be "
    "folded out of the residual stream",
    "bert": "BERT normalises the residual stream itself after each block (post-LayerNorm), so the norm's "
    "scale cannot be folded out of the stream",
}
"""Families where R1 cannot fold into a standard GGUF (why, in one clause): they get R2 alone."""

_LAYERNORM = ("gpt2",)  # LayerNorm families: Q keeps the all-ones direction, so the mean commutes

_INPUT_NORM = re.compile(r"\.(?:input_layernorm|ln_1)\.weight$")
_POST_NORM = re.compile(r"\.(?:post_attention_layernorm|ln_2)\.weight$")
_FINAL_NORM = re.compile(r"(?:^|\.)(?:norm|ln_f)\.weight$")
_NORM_BIAS = re.compile(r"\.(?:ln_1|ln_2|ln_f)\.bias$")  # GPT-2's LayerNorm biases
_BUFFER = re.compile(r"(?:rotary_emb\.inv_freq|attn\.(?:masked_)?bias)$")  # not weights: kept as they are
_HEAD_NORM = re.compile(r"self_attn\.[qk]_norm\.weight$")  # inside a head: untouched by R1

_ATTN_READERS = (Role.ATTN_Q, Role.ATTN_K, Role.ATTN_V, Role.ATTN_QKV)
_FFN_READERS = (Role.FFN_GATE, Role.FFN_UP, Role.FFN_GATE_UP, Role.FFN_ROUTER, Role.FFN_GATE_EXPS,
                Role.FFN_UP_EXPS)  # fmt: skip
_WRITERS = (Role.ATTN_OUT, Role.FFN_DOWN, Role.FFN_DOWN_EXPS)


_RIGHT_VALUES = 1 << 22  # values Rotor.right rotates at once (16 MB of float32 per temporary)


class RotationError(StudioError):
    """A model cannot be rotated, or its rotation does not compute the same function."""


@dataclass(frozen=True)
class Rotation:
    """Which rotations to fold and the seed that draws them."""

    seed: int = 0
    r1: bool = True
    r2: bool = True

    def metadata(self, hidden: int, head_dim: int, *, keeps_mean: bool = False) -> dict[str, Any]:
        """The ``quantize.rotation.*`` keys that record this rotation in a GGUF file (``keeps_mean``: R1 maps
        the all-ones direction to itself, for LayerNorm)."""
        extra = {"quantize.rotation.r1_keeps_mean": True} if keeps_mean and self.r1 else {}
        return extra | {
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
    factors: ``right(x) = x·Q`` costs ``n·(2^k + m)`` per row instead of ``n²``. With ``house`` (a unit
    vector ``v``) it is followed by the reflection ``I − 2·v·vᵀ`` that maps the all-ones direction back
    onto itself (``Q·1 = 1``), as LayerNorm's mean subtraction needs."""

    signs: np.ndarray  # (n,) ±1
    h: np.ndarray  # (2^k, 2^k) orthogonal Walsh–Hadamard
    r: np.ndarray  # (m, m) orthogonal, m odd
    house: np.ndarray | None = None  # (n,) unit, float64: the Householder step, or None

    @property
    def n(self) -> int:
        """The order of the rotation."""
        return len(self.signs)

    def matrix(self) -> np.ndarray:
        """``Q`` itself (float64): for tests and small orders."""
        q = self.signs[:, None] * np.kron(self.h, self.r)
        if self.house is not None:
            q = q - 2.0 * np.outer(q @ self.house, self.house)
        return q

    def right(self, x: np.ndarray) -> np.ndarray:
        """``x·Q`` over the last axis of ``x`` (float32 in, float32 out), into a new array a block of rows at
        a time: whole, a 151,936-row head held two temporaries of its size at once (0.93 GB each on the 1.5B)."""
        x = np.asarray(x, dtype=np.float32)
        n, k, m = self.n, self.h.shape[0], len(self.r)
        flat = x.reshape(-1, n)
        out = np.empty(flat.shape, dtype=np.float32)
        signs, ht, r = self.signs.astype(np.float32), self.h.T.astype(np.float32), self.r.astype(np.float32)
        v = None if self.house is None else self.house.astype(np.float32)
        step = max(1, _RIGHT_VALUES // n)
        for a in range(0, len(flat), step):
            # row index a·m + b: (x·(H ⊗ R))[c·m + d] = Σ x[a, b]·H[a, c]·R[b, d] = (Hᵀ·X·R)[c, d]
            y = np.matmul(ht, (flat[a : a + step] * signs).reshape(-1, k, m))
            y = np.matmul(y, r).reshape(-1, n)
            if v is not None:  # ·(I − 2·v·vᵀ)
                y -= np.float32(2.0) * np.outer(y @ v, v)
            out[a : a + step] = y
        return out.reshape(x.shape)


def rotor(n: int, seed: int, salt: int = 0, *, keep_mean: bool = False) -> Rotor:
    """A randomised Hadamard rotation of order ``n``: ``diag(±1)·(H_{2^k} ⊗ R_m)`` with ``n = 2^k·m``,
    ``m`` odd and ``R_m`` a seeded random orthogonal matrix (identity when ``m = 1``).

    Every entry of the Hadamard factor has the same magnitude, so one outlier channel is spread over
    ``2^k`` channels; the small odd factor only mixes within its ``m`` (576 = 64·9, 1536 = 512·3).
    ``keep_mean`` adds the Householder step that makes ``Q·1 = 1`` (a rank-one change: the rest stays
    spread), for LayerNorm, whose mean subtraction then commutes with ``Q``.
    """
    rng = np.random.default_rng([int(seed), int(salt), int(n)])
    k = (n & -n).bit_length() - 1  # largest power of two dividing n
    m = n >> k
    r = random_orthogonal(m, rng) if m > 1 else np.ones((1, 1))
    signs = rng.choice(np.array([-1.0, 1.0]), size=n)
    base = Rotor(signs, hadamard(1 << k), r)
    if not keep_mean:
        return base
    c = np.full(n, 1.0 / np.sqrt(n))
    a = _right64(base, c)  # cᵀ·Q: where the rotation sends the all-ones direction
    v = a - c  # the reflection across v's normal plane swaps a and c
    norm = float(np.linalg.norm(v))
    return base if norm < 1e-12 else Rotor(signs, base.h, r, v / norm)


def _right64(rot: Rotor, x: np.ndarray) -> np.ndarray:
    """``x·Q`` of one row in float64 (the Householder vector must be exact, not float32)."""
    k, m = rot.h.shape[0], len(rot.r)
    return (rot.h.T @ (x * rot.signs).reshape(k, m) @ rot.r).reshape(-1)


def rotation_matrix(n: int, seed: int, salt: int = 0, *, keep_mean: bool = False) -> np.ndarray:
    """``rotor(n, seed, salt, keep_mean=...)`` as a dense float64 matrix."""
    return rotor(n, seed, salt, keep_mean=keep_mean).matrix()


# ------------------------------------------------------------------------------------------ support


def refusal(info: ModelInfo) -> str | None:
    """Why ``info`` cannot be rotated (one sentence), or None when it can."""
    mt = str(info.model_type).lower()
    if getattr(info.format, "value", info.format) == "gguf":
        return (
            "Rotation is folded into a Hugging Face folder's float weights; open a GGUF original through its "
            "converted folder (gguf_source.hf_folder_for), as export --rotate and the Export dialog do."
        )
    if mt not in ROTATABLE:
        return f"Rotation does not cover model type {mt!r} yet (it covers {', '.join(ROTATABLE)})."
    for t in info.tensors:
        if t.role in _WRITERS + _ATTN_READERS + _FFN_READERS and len(t.shape) == 3:
            return f"Rotation does not cover fused 3-D expert tensors such as {t.name} yet."
        if t.role is Role.NORM and t.name.endswith(".bias") and mt not in _LAYERNORM and mt not in R2_ONLY:
            return f"Rotation does not fold a norm with a bias ({t.name})."
    return None


def check_rotatable(info: ModelInfo) -> None:
    """Raise ``RotationError`` (one sentence) when ``info`` cannot be rotated."""
    why = refusal(info)
    if why:
        raise RotationError(why)


def dims(config: dict[str, Any]) -> tuple[int, int, int, int]:
    """(hidden, heads, kv heads, head dim) of a decoder config (GPT-2's ``n_embd``/``n_head`` too)."""
    hidden = int(config.get("hidden_size") or config["n_embd"])
    n_head = int(config.get("num_attention_heads") or config.get("n_head") or 1)
    n_kv = int(config.get("num_key_value_heads") or n_head)
    head_dim = int(config.get("head_dim") or hidden // n_head)
    return hidden, n_head, n_kv, head_dim


# ------------------------------------------------------------------------------------------ the view


class RotatedCheckpoint(Checkpoint):
    """``inner`` with R1 (and R2) folded in: every tensor is produced rotated, in float32, when read.

    A tied head becomes ``lm_head.weight`` of its own (``untied_bytes`` says what it adds as float32)
    and the config says ``tie_word_embeddings: false``. On an ``R2_ONLY`` family the view folds R2 alone
    (``notes`` says why) and leaves the head, the norms and the stream as they are.
    """

    def __init__(self, inner: Checkpoint, rotation: Rotation) -> None:
        info = inner.info
        check_rotatable(info)
        mt = str(info.model_type).lower()
        self.r1_refused = R2_ONLY.get(mt) if rotation.r1 else None
        if self.r1_refused:
            rotation = dataclasses.replace(rotation, r1=False)
        self.inner = inner
        self.rotation = rotation
        self.layernorm = mt in _LAYERNORM
        cfg = dict(info.config)
        self.hidden, self.n_head, self.n_kv, self.head_dim = dims(cfg)
        self.notes: tuple[str, ...] = (
            (f"Only R2 (within each attention head) is folded into this {mt} model: {self.r1_refused}.",)
            if self.r1_refused
            else ()
        )
        self._embed = next((t for t in info.tensors if t.role is Role.TOKEN_EMBD), None)
        self._final_norm: str | None = None
        self._norms: dict[tuple[int, str], str] = {}  # (layer, "attn"/"ffn") -> the norm its readers read
        self.untied = False
        self.head_name: str | None = None
        tensors = [dataclasses.replace(t, dtype="F32", nbytes=4 * t.n_elements) for t in info.tensors]
        if rotation.r1:
            tensors += self._r1_setup(info)
            cfg["tie_word_embeddings"] = False
        cfg[ROTATION_CONFIG_KEY] = rotation.metadata(self.hidden, self.head_dim, keeps_mean=self.layernorm)
        super().__init__(dataclasses.replace(info, config=cfg, tensors=tuple(tensors)))
        self._q: Rotor | None = None
        self._r2: dict[int, np.ndarray] = {}

    def _r1_setup(self, info: ModelInfo) -> list[TensorInfo]:
        """Find what R1 folds (embedding, norms, head) and refuse a tensor whose place is unknown; the
        untied head's entry when the model had none."""
        if self._embed is None:
            raise RotationError(f"{info.path.name} has no token embedding to rotate.")
        self._final_norm = next(
            (t.name for t in info.tensors if t.layer is None and _FINAL_NORM.search(t.name)), None
        )
        if self._final_norm is None:
            raise RotationError(f"{info.path.name} has no final norm to fold.")
        for t in info.tensors:
            if t.layer is not None and t.role is Role.NORM:
                for which, pattern in (("attn", _INPUT_NORM), ("ffn", _POST_NORM)):
                    if pattern.search(t.name):
                        self._norms[(t.layer, which)] = t.name
        for t in info.tensors:
            self._classify(t)  # refuse a block tensor whose place in the stream is unknown
        bias = self._final_norm[: -len("weight")] + "bias"
        if bias in self.inner:  # kept as (b/s)·Q: s must have no zero where b has a value
            s, b = self.inner.read(self._final_norm), self.inner.read(bias)
            if np.any((s == 0) & (b != 0)):
                raise RotationError(
                    f"{self._final_norm} scales a channel by zero that its bias moves, so it cannot be folded."
                )
        self.untied = not any(t.role is Role.OUTPUT for t in info.tensors)
        self.head_name = "lm_head.weight"
        if not self.untied:
            self.head_name = next(t.name for t in info.tensors if t.role is Role.OUTPUT)
            return []
        if self.head_name in self.inner:
            raise RotationError(f"{info.path.name} has an {self.head_name} that is not the head.")
        e = self._embed
        return [
            dataclasses.replace(
                e, name=self.head_name, role=Role.OUTPUT, dtype="F32", nbytes=4 * e.n_elements
            )
        ]

    @property
    def untied_bytes(self) -> int:
        """Float32 bytes of the head this view adds by untying it (0 when the model had its own)."""
        return 4 * self._embed.n_elements if self.untied and self._embed is not None else 0

    # -- matrices (cached: R1 as its factors, R2 head_dim² per layer)
    def q(self) -> Rotor | None:
        """R1 (None when R1 is off)."""
        if self._q is None and self.rotation.r1:
            self._q = rotor(self.hidden, self.rotation.seed, keep_mean=self.layernorm)
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
        if not self.rotation.r1:  # R2 alone: values and o_proj turn, everything else stays
            if t.layer is not None and t.role in (Role.ATTN_V, Role.ATTN_QKV):
                return "reader" if t.name.endswith(".weight") else "bias"
            return (
                "writer"
                if t.layer is not None and t.role is Role.ATTN_OUT and t.name.endswith(".weight")
                else "keep"
            )
        if t.role in (Role.TOKEN_EMBD, Role.POS_EMBD):
            return "embed"
        if t.role is Role.OUTPUT:
            return "head"
        if t.role is Role.NORM:
            if _HEAD_NORM.search(t.name):
                return "keep"
            if self.layernorm and _NORM_BIAS.search(t.name):
                return "normbias"
            if _INPUT_NORM.search(t.name) or _POST_NORM.search(t.name) or t.name == self._final_norm:
                return "norm"
        elif t.role in _ATTN_READERS or t.role in _FFN_READERS:
            # a q/k/v bias is on the output side: R1 leaves it (a LayerNorm's bias adds W·b), R2 turns v's
            return "reader" if t.name.endswith(".weight") else "bias"
        elif t.role in _WRITERS:
            return "writer"
        elif t.role is Role.OTHER and len(t.shape) <= 1 and t.layer is None:
            return "keep"  # a buffer (rotary inv_freq)
        if t.role is Role.OTHER and _BUFFER.search(t.name):
            return "keep"
        raise RotationError(f"Rotation does not know where {t.name} sits in the residual stream.")

    def _norm_of(self, t: TensorInfo) -> str:
        """The norm whose output ``t`` reads."""
        if t.role is Role.OUTPUT:
            assert self._final_norm is not None
            return self._final_norm
        which = "attn" if t.role in _ATTN_READERS else "ffn"
        name = self._norms.get((t.layer, which)) if t.layer is not None else None
        if name is None:
            raise RotationError(f"Rotation cannot find the norm that {t.name} reads.")
        return name

    # -- reading
    def _rotated(self, t: TensorInfo) -> np.ndarray:
        kind = "head" if t.name == self.head_name else self._classify(self.inner.info.tensor(t.name))
        if kind == "keep":
            return np.asarray(self.inner.read(t.name), dtype=np.float32)
        if kind == "norm":
            return np.ones(t.shape, dtype=np.float32)
        if kind == "normbias":
            if t.layer is not None:  # folded into the readers' biases
                return np.zeros(t.shape, dtype=np.float32)
            # the final norm's: llama.cpp's GPT-2 head has no bias, so the norm keeps (b/s)·Q and the head s
            s, b = self.inner.read(self._final_norm), self.inner.read(t.name)
            return self._right(np.divide(b, s, out=np.zeros(t.shape, dtype=np.float32), where=s != 0))
        if kind == "embed":
            return self._right(self.inner.read(t.name))
        if kind == "bias":
            b = np.array(self.inner.read(t.name), dtype=np.float32)
            w_name = t.name[: -len("bias")] + "weight"
            if self.rotation.r1 and self.layernorm and w_name in self.inner:
                w = self._linear(w_name)  # LayerNorm's bias through the reader: b + W·b_norm
                b += w @ self.inner.read(
                    self._norm_of(self.inner.info.tensor(w_name))[: -len("weight")] + "bias"
                )
            return self._r2_values(t, b[:, None])[:, 0]
        if kind == "head":
            w = _scaled(
                self.inner.read(self._embed.name if self.untied else t.name), self.inner, self._norm_of(t)
            )
            return self._right(w)
        info, lin = self.inner.info.tensor(t.name), self._linear(t.name)  # a reader or writer of the stream
        if kind == "reader":
            w = self._right(_scaled(lin, self.inner, self._norm_of(t))) if self.rotation.r1 else lin
            return self._stored(info, self._r2_values(t, w))
        # writer: Qᵀ·W = (Wᵀ·Q)ᵀ (a bias b·Q); o_proj's input columns per head ·R2
        if lin.ndim == 1:
            return self._right(lin)
        w = self._right(np.ascontiguousarray(lin.T)).T if self.rotation.r1 else lin
        if t.role is Role.ATTN_OUT and t.layer is not None:
            d = self.head_dim
            w = (w.reshape(w.shape[0], -1, d) @ self.r2(t.layer)).reshape(w.shape)
        return self._stored(info, w)

    def _linear(self, name: str) -> np.ndarray:
        """The weight ``name`` as nn.Linear holds it, (out, in): GPT-2's Conv1D stores it (in, out)."""
        w = self.inner.read(name)
        return np.ascontiguousarray(w.T) if w.ndim == 2 and self.inner.info.tensor(name).transposed else w

    @staticmethod
    def _stored(info: TensorInfo, w: np.ndarray) -> np.ndarray:
        """``w`` (out, in) back in the layout ``info`` is stored in."""
        return np.ascontiguousarray(w.T if info.transposed and w.ndim == 2 else w)

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


def rotation_of(info: ModelInfo) -> Rotation | None:
    """The rotation a rotated view's ``info`` was made with (None for a model as it is): the scan, the
    imatrix and the held-out judgement of a rotated plan reopen the model through it."""
    meta = rotation_config(info)
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
