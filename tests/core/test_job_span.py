"""``JobContext.span`` and ``muted``: the one facility for a step's progress inside a job."""

from __future__ import annotations

from studio.core.jobs import SPAN_STEPS, JobContext


def _job() -> tuple[JobContext, list[tuple[int, int, str]], list[str]]:
    seen: list[tuple[int, int, str]] = []
    logs: list[str] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append((d, t, m)), on_log=logs.append, min_interval=0)
    return ctx, seen, logs


def test_a_span_fills_its_part_of_the_bar_and_nests():
    ctx, seen, logs = _job()
    step = ctx.span(0.5, 1.0)
    step.report(1, 4, "a quarter")
    step.span(0.0, 0.5).report(1, 1, "inner done")
    step.log("one line")
    assert seen == [(625, SPAN_STEPS, "a quarter"), (750, SPAN_STEPS, "inner done")]
    assert logs == ["one line"]
    step.say("again")  # the last progress (the inner step's), with a new message
    assert seen[-1] == (750, SPAN_STEPS, "again")


def test_a_muted_step_shows_nothing_but_shares_the_cancel_flag():
    ctx, seen, logs = _job()
    quiet = ctx.muted()
    quiet.report(3, 4, "hidden")
    quiet.log("hidden")
    assert seen == [] and logs == []
    assert quiet.cancel_flag is ctx.cancel_flag and ctx.span(0, 1).cancel_flag is ctx.cancel_flag
    ctx.cancel()
    assert quiet.cancelled


def test_a_report_held_back_by_the_throttle_is_sent_at_the_next_cancellation_check():
    """A step announced right after the one before ended (GPTQ's down_proj after up_proj, within the 50 ms
    throttle) runs for minutes: its line was dropped and the progress went on naming up_proj (issue 40's
    8B fixture). The held report now goes out at the first cancellation check once the interval has
    passed, through a span too; a report that got through leaves nothing held."""
    import time

    from studio.core.jobs import JobContext

    seen: list[str] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append(m), min_interval=0.05)
    span = ctx.span(0.0, 1.0)
    span.report(1, 10, "gptq up_proj")
    span.report(2, 10, "gptq down_proj")  # within the interval: held
    span.check_cancelled()
    assert seen == ["gptq up_proj"]
    time.sleep(0.06)
    span.check_cancelled()  # what a sweep calls every block of columns
    assert seen == ["gptq up_proj", "gptq down_proj"]
    time.sleep(0.06)
    span.check_cancelled()
    assert seen == ["gptq up_proj", "gptq down_proj"]  # sent once
