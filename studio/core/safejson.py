"""Reading untrusted JSON and the numbers in it: one sentence for every way it can be hostile.

``json.loads`` raises RecursionError on deep nesting, ValueError on integers of more than 4,300
digits, and gives ``inf`` for ``1e400``; a nesting that parses (say 900 levels) can still blow up
whatever walks it later. ``loads`` turns each of these into the caller's ``StudioError`` and caps
the depth; ``bounded_int`` reads an integer field within sane limits (no bool, no ``inf``, no
fraction), quoting the offending value shortened.
"""

from __future__ import annotations

import json
from typing import Any

from studio.core.errors import StudioError, quote

MAX_DEPTH = 64  # Quant Studio's own files nest 4 levels; Hugging Face configs fewer than 10


def depth(obj: Any, limit: int = MAX_DEPTH) -> int:
    """Nesting depth of lists and dicts in ``obj`` (iterative; stops counting past ``limit``)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items: Any = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        deepest = max(deepest, d)
        if deepest > limit:
            return deepest
        stack.extend((x, d + 1) for x in items)
    return deepest


def loads(
    text: str | bytes,
    what: str,
    error: type[Exception],
    *,
    max_depth: int = MAX_DEPTH,
    keys: tuple[str, ...] | None = None,
    **kwargs: Any,
) -> Any:
    """``json.loads(text)``, or ``error`` with one sentence starting with ``what`` ("The plan file x.json").

    ``keys`` (a tuple, possibly empty) asks for an object holding at least those keys (the shape check:
    a plan is an object, a scan an object with its version, model and tensors)."""
    try:
        obj = json.loads(text, **kwargs)
    except json.JSONDecodeError as err:
        raise error(f"{what} is not valid JSON ({err.msg} at line {err.lineno}).") from None
    except RecursionError:
        raise error(f"{what} nests its JSON too deeply to be read (more than {max_depth} levels).") from None
    except UnicodeDecodeError:
        raise error(f"{what} is not UTF-8 text.") from None
    except ValueError as err:  # an integer of thousands of digits
        raise error(
            f"{what} holds a number that cannot be read ({' '.join(str(err).split())[:80]})."
        ) from None
    if depth(obj, max_depth) > max_depth:
        raise error(f"{what} nests its JSON more than {max_depth} levels deep; it is not a file this reads.")
    if keys is not None:
        expect_object(obj, what, error, keys)
    return obj


def expect_object(obj: Any, what: str, error: type[StudioError], keys: tuple[str, ...] = ()) -> dict:
    """``obj`` if it is a JSON object holding ``keys``, else ``error`` saying what it is instead."""
    if not isinstance(obj, dict):
        got = (
            "null"
            if obj is None
            else {list: "a list", str: "a string", bool: "true or false"}.get(type(obj), "a number")
        )
        raise error(f"{what} holds {got}, not a JSON object.")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise error(f"{what} has no {quote(missing[0])} field; it is not a file this reads.")
    return obj


def bounded_int(value: Any, what: str, lo: int, hi: int, error: type[Exception]) -> int:
    """``value`` as an int in ``[lo, hi]`` (an integral float such as ``4.0`` is accepted), else ``error``
    naming ``what`` ("the plan's ftype") and the value, shortened."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise error(f"{what.capitalize()} must be a whole number, not {quote(value)}.")
    if isinstance(value, float):
        if not value.is_integer():  # nan, inf and fractions
            raise error(f"{what.capitalize()} must be a whole number, not {quote(value)}.")
        value = int(value)
    if not lo <= value <= hi:
        shown = quote(value) if value.bit_length() < 64 else f"a number of about 2**{value.bit_length()}"
        raise error(f"{what.capitalize()} is {shown}; it must be between {lo:,} and {hi:,}.")
    return value


__all__ = ["MAX_DEPTH", "bounded_int", "depth", "expect_object", "loads"]
