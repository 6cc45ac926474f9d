"""Patterns from plans and --override: refused before compiling when they recurse or repeat past the limits
(issue 39); ordinary patterns pass."""

from __future__ import annotations

import pytest

from studio.core.errors import StudioError


@pytest.mark.parametrize(
    ("pattern", "why"),
    [
        ("(?R)", "recurses"),
        ("a(?1)", "recurses"),
        ("(?P<x>a)(?P>x)", "recurses"),
        ("(?&x)", "recurses"),
        ("(?:a{65535}){65535}", "repeat count of 65,535"),
        ("(?:(?:a{30}){30}){30}", "multiply to 27,000"),
        ("a{,5000}", "repeat count of 5,000"),
    ],
)
def test_saferegex_refuses_recursion_and_huge_repeats_before_compiling(pattern, why):
    from studio.core.saferegex import compile_pattern

    with pytest.raises(StudioError, match=f"pattern .* is refused: .*{why}"):
        compile_pattern(pattern, StudioError)


@pytest.mark.parametrize(
    "pattern", [r"blk\.[0-9]{1,3}\.attn", "(?:a{100}){100}", r"\{9999}", "[{]{2}", ".*ffn_down.*"]
)
def test_saferegex_keeps_ordinary_patterns(pattern):
    from studio.core.saferegex import compile_pattern

    assert compile_pattern(pattern, StudioError).pattern == pattern
