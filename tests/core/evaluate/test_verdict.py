"""Verdicts in plain words: the seed's absolute rules, the relative form for other perplexity scales."""

from __future__ import annotations

import math

import pytest

from studio.core.evaluate.verdict import REFERENCE_PPL, Verdict, judge

E, G, A, W = Verdict.EXCELLENT, Verdict.GOOD, Verdict.ACCEPTABLE, Verdict.WRONG


@pytest.mark.parametrize(
    ("delta", "expected"),
    [(-0.3, E), (0.0, E), (0.49, E), (0.5, G), (0.99, G), (1.0, A), (1.99, A), (2.0, W), (7.0, W)],
)
def test_absolute_rules_at_the_scale_they_were_made_for(delta, expected):
    j = judge(6.0, 6.0 + delta)
    assert j.form == "absolute" and j.absolute is expected and j.verdict is expected


def test_relative_form_for_other_scales():
    # +2 PPL on a model at 60 is 3.3 % worse: excellent, although the absolute rule says otherwise
    j = judge(60.0, 62.0)
    assert j.form == "relative" and j.absolute is W and j.verdict is E
    assert j.delta_pct == pytest.approx(100 * 2 / 60)
    # +0.4 PPL on a model at 2 is 20 % worse: acceptable, not excellent
    j = judge(2.0, 2.4)
    assert j.form == "relative" and j.absolute is E and j.verdict is A
    # the relative thresholds are the absolute ones divided by the reference perplexity
    for pct, expected in ((8.0, E), (9.0, G), (16.0, G), (17.0, A), (33.0, A), (34.0, W)):
        assert judge(100.0, 100.0 * (1 + pct / 100)).relative is expected, pct


def test_both_forms_agree_at_the_reference():
    for delta in (0.2, 0.7, 1.5, 3.0):
        j = judge(REFERENCE_PPL, REFERENCE_PPL + delta)
        assert j.absolute is j.relative


def test_form_switches_outside_a_factor_of_two():
    assert judge(3.0, 3.1).form == "absolute" and judge(12.0, 12.1).form == "absolute"
    assert judge(2.9, 3.0).form == "relative" and judge(12.5, 12.6).form == "relative"


def test_failed_numbers_are_not_excellent():
    j = judge(10.0, math.nan)
    assert j.verdict is W
    d = j.to_dict()
    assert d["delta_ppl"] is None and d["verdict"] == "something went wrong"
    assert "excellent" in judge(6.0, 6.1).text and "absolute rule" in judge(6.0, 6.1).text
