"""The Hugging Face token: kept in the OS keyring when one is available, never in plain settings or logs."""

from __future__ import annotations

import os
from dataclasses import dataclass

from studio.core.untrusted import redact_secrets

KEYRING_SERVICE = "quant-studio"
KEYRING_USER = "huggingface-token"


@dataclass(frozen=True)
class TokenSource:
    """Where a token came from (for the GUI to say "signed in via keyring"), never the token itself."""

    origin: str  # "keyring" | "environment" | "huggingface-cli" | "none"

    def __repr__(self) -> str:
        return f"TokenSource({self.origin!r})"


def _keyring():  # noqa: ANN202
    try:
        import keyring  # optional (quant-studio[keyring]): tried where used
        from keyring.backends.fail import Keyring as FailKeyring  # optional, as above
    except ImportError:  # keyring is optional: without it tokens come from the environment or the HF file
        return None
    try:
        backend = keyring.get_keyring()
    except Exception:  # a broken keyring backend must not break the app
        return None
    if isinstance(backend, FailKeyring):
        return None
    return keyring


def keyring_available() -> bool:
    """Whether an OS keyring can store the token."""
    return _keyring() is not None


def get_token() -> tuple[str | None, TokenSource]:
    """The token to use: the keyring first, then HF_TOKEN, then huggingface_hub's own login, else none."""
    kr = _keyring()
    if kr is not None:
        try:
            token = kr.get_password(KEYRING_SERVICE, KEYRING_USER)
        except Exception:
            token = None
        if token:
            return token, TokenSource("keyring")
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        return token.strip(), TokenSource("environment")
    try:
        from huggingface_hub import get_token as hf_get_token

        token = hf_get_token()
    except Exception:
        token = None
    if token:
        return token, TokenSource("huggingface-cli")
    return None, TokenSource("none")


def store_token(token: str) -> bool:
    """Save the token in the OS keyring; False when there is no keyring (keep it for this session only)."""
    kr = _keyring()
    if kr is None:
        return False
    try:
        kr.set_password(KEYRING_SERVICE, KEYRING_USER, token.strip())
    except Exception:
        return False
    return True


def forget_token() -> None:
    """Remove the token from the OS keyring, if it is there."""
    kr = _keyring()
    if kr is None:
        return
    try:
        kr.delete_password(KEYRING_SERVICE, KEYRING_USER)
    except Exception:
        pass


def redact(text: str, token: str | None) -> str:
    """``text`` with ``token`` (and anything shaped like a bearer token) replaced, for anything that may reach a log."""
    return redact_secrets(text, token)
