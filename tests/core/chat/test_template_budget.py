"""Issue 25 item 3: one chat-template budget that cannot be bypassed (FAULTS.md, wave 3).

Loops over strings tick the deadline, filter and method bombs are refused before they allocate,
and rendering runs in a child that is killed when a single C-level call outlives the budget or
the job is cancelled. Chat (transformers and GGUF) and calibration all render through it.
"""

from __future__ import annotations

import resource
import threading
import time

import pytest

from studio.core.chat.render import render_chat
from studio.core.chat.template import fallback_text
from studio.core.jobs import JobCancelled, JobContext

MSGS = [{"role": "user", "content": "Hi there"}]

NESTED = "{% set s='x'*999999 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"
BOMBS = {
    "nested-string-loop": (NESTED, "ran longer than 2 s"),
    "replace": ("{{ ('x'*999999)|replace('x','y'*3000) }}", "result of replace would be 2,999,997,000"),
    "join-filter": ("{{ ('x'*999999)|join('y'*3000) }}", "a join would be"),
    "join-list": ("{{ (['x'*999999]*1000)|join }}", "a join would be"),
    "str-join": ("{{ ('y'*3000).join('x'*999999) }}", "a join would be"),
    "str-replace": ("{{ ('x'*999999).replace('x','y'*3000) }}", "result of replace"),
    "indent": ("{{ ('\\n'*999999)|indent('y'*3000, true, true) }}", "result of indent"),
    "percent-mapping": ("{{ ('%(a)s'*100000) % {'a': 'x'*999999} }}", "%-format"),
    "str-format": ("{{ ('{0}'*100000).format('x'*999999) }}", "result of format"),
    "int-square": (
        "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
        "product of integers",
    ),
    "int-power": ("{{ (10**500)**500 }}", "is too large"),
}


@pytest.fixture(scope="module", autouse=True)
def warm_worker():
    # the child starts once per process (a spawn); the budget is about rendering, not that start
    render_chat("{{ messages[0].content }}", MSGS)
    yield
    from studio.core.chat.template_worker import stop_worker

    stop_worker()


def child_peak_rss() -> int:
    from studio.core.chat.template_worker import child_peak_rss as peak

    return peak()


def render_chats(*args, **kwargs):
    from studio.core.chat.render import render_chats as render

    return render(*args, **kwargs)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@pytest.mark.parametrize("template, why", BOMBS.values(), ids=BOMBS.keys())
def test_template_bombs_end_within_the_budget_with_the_fallback(template, why):
    before = _rss_mb()
    t0 = time.monotonic()
    got = render_chat(template, MSGS, source="bomb.jinja")
    took = time.monotonic() - t0
    assert took <= 3.0, f"{took:.1f} s"
    assert got.template == "fallback" and got.text == fallback_text(MSGS)
    assert "bomb.jinja" in got.warning and "budget" in got.warning and why in got.warning
    assert child_peak_rss() < 300 << 20
    assert _rss_mb() - before < 50  # nothing was rendered in this process


def test_a_c_level_call_past_the_budget_is_killed():
    # builtin sum() of 100,000 lists is quadratic inside C: no budget tick can run until it returns
    t0 = time.monotonic()
    got = render_chat("{{ ([[0]] * 100000)|sum(start=[]) }}", MSGS, time_budget_s=0.5)
    assert time.monotonic() - t0 < 0.5 + 2.0
    assert got.template == "fallback" and "was stopped" in got.warning
    # the next render gets a fresh child
    assert render_chat("<{{ messages[0].content }}>", MSGS).text == "<Hi there>"


def test_cancel_kills_a_render_stuck_in_c_code():
    ctx = JobContext()
    threading.Timer(0.3, ctx.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(JobCancelled):
        render_chat("{{ ([[0]] * 100000)|sum(start=[]) }}", MSGS, time_budget_s=60, ctx=ctx)
    assert time.monotonic() - t0 < 3.0


def test_a_loop_over_a_string_counts_every_step():
    # nothing but the loops themselves: no call, filter or operator inside them ticks the old budget
    got = render_chat(
        "{% set s = 'x' * 999999 %}{% set t = 'y' * 999 %}{% for c in s %}{% for d in t %}{% endfor %}{% endfor %}",
        MSGS,
        time_budget_s=0.3,
    )
    assert got.template == "fallback" and "ran longer than 0.3 s" in got.warning


def test_templates_that_use_these_operations_lightly_still_render():
    template = (
        "{% for m in messages %}{{ m.content|replace('Hi', 'Hello')|indent(2, true) }}"
        "{{ ['a', 'b']|join('-') }}{{ '-'.join(['c', 'd']) }}{{ '%s!' % m.role }}{{ '{0}?'.format(m.role) }}"
        "{% for ch in m.role %}{{ ch|upper }}{% endfor %}{{ 2 ** 10 }}{{ 3 * 4 }}{% endfor %}"
    )
    got = render_chat(template, MSGS)
    assert got.template == "model", got.warning
    assert got.text == "  Hello therea-bc-duser!user?USER102412"


def test_many_chats_render_in_one_child_with_progress():
    # 20,000 tiny chats (the 100k case of the issue is in the slow tier): one compiled template
    chats = [
        [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": "a"}] for i in range(20_000)
    ]
    seen: list[int] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append(d), min_interval=0.0)
    t0 = time.monotonic()
    out = render_chats("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", chats, ctx=ctx)
    took = time.monotonic() - t0
    assert [r.text for r in out[:2]] == ["<user>q0<assistant>a", "<user>q1<assistant>a"]
    assert len(out) == 20_000 and all(r.template == "model" for r in out)
    assert len(seen) >= 2 and seen[-1] == 20_000
    assert took < 30, f"{took:.1f} s"


@pytest.mark.slow
def test_100k_tiny_chats_take_seconds_not_minutes():
    chats = [[{"role": "user", "content": f"q{i}"}] for i in range(100_000)]
    seen: list[int] = []
    ctx = JobContext(on_progress=lambda d, t, m: seen.append(d), min_interval=0.0)
    t0 = time.monotonic()
    out = render_chats("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}", chats, ctx=ctx)
    took = time.monotonic() - t0
    assert len(out) == 100_000 and out[-1].text == "<user>q99999"
    assert len(seen) > 5 and seen[-1] == 100_000
    assert took < 60, f"{took:.1f} s"


def test_a_bomb_is_tried_once_for_many_chats():
    chats = [MSGS] * 50
    t0 = time.monotonic()
    out = render_chats(NESTED, chats, time_budget_s=0.3)
    assert time.monotonic() - t0 < 3.0
    assert all(r.template == "fallback" for r in out) and "ran longer" in out[-1].warning


# -- the same budget in chat (transformers and GGUF) and calibration --------------------------------

E2E = {"nested": NESTED, "replace": BOMBS["replace"][0], "join": BOMBS["join-filter"][0]}


@pytest.fixture(scope="module")
def bomb_models(chat_model, tmp_path_factory):
    from tests.core.chat.fixtures import model_with_template

    root = tmp_path_factory.mktemp("bomb-templates")
    return {k: model_with_template(chat_model, root / k, t) for k, t in E2E.items()}


@pytest.mark.parametrize("kind", E2E)
def test_bombs_in_transformers_chat(kind, bomb_models):
    from studio.core.chat import Message
    from studio.core.chat.hf_backend import TransformersBackend

    b = TransformersBackend(bomb_models[kind], n_ctx=128, device="cpu", dtype="float32")
    b.load()
    try:
        t0 = time.monotonic()
        p = b.prompt([Message("user", "Hello")])
        assert time.monotonic() - t0 <= 3.0
        assert p.template == "fallback" and p.text == "User: Hello\nAssistant:" and "budget" in p.warning
        assert child_peak_rss() < 300 << 20
    finally:
        b.close()


@pytest.mark.parametrize("kind", E2E)
def test_bombs_in_gguf_chat(kind, bomb_models, gguf_of):
    from studio.core.chat import Message
    from studio.core.chat.llama_backend import LlamaCppBackend

    gguf = gguf_of(bomb_models[kind], "F32")
    b = LlamaCppBackend(gguf, n_ctx=128)
    b.load()
    try:
        t0 = time.monotonic()
        p = b.prompt([Message("user", "Hello")])
        assert time.monotonic() - t0 <= 3.0
        assert p.template == "fallback" and "budget" in p.warning and gguf.name in p.warning
        assert child_peak_rss() < 300 << 20
    finally:
        b.close()


@pytest.mark.parametrize("kind", E2E)
def test_bombs_in_calibration_with_the_builtin_text(kind, bomb_models):
    from studio.core.calib.calibrate import load_tokenizer, prepare_input

    tok = load_tokenizer(bomb_models[kind])
    t0 = time.monotonic()
    inp = prepare_input(bomb_models[kind], n_ctx=64, n_chunks=2, tokenizer=tok)
    assert time.monotonic() - t0 <= 3.0 + 2.0  # the budget, plus tokenizing the whole built-in text
    assert any("was not used" in w and "budget" in w for w in inp.warnings)
    assert "User: " in inp.data.text  # the dialogues in the built-in format
    assert child_peak_rss() < 300 << 20
