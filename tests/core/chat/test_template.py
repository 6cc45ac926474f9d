"""Chat templates run only in our budgeted jinja2 sandbox (FAULTS 17 and 18)."""

from __future__ import annotations

import pytest

from studio.core.chat.render import render_chat
from studio.core.chat.template import fallback_text, plain_text
from studio.core.factory import (
    CHATML_TEMPLATE,
    GEMMA_TEMPLATE,
    MISTRAL_TEMPLATE,
    PHI3_TEMPLATE,
    ZEPHYR_TEMPLATE,
)
from studio.core.jobs import JobCancelled, JobContext
from tests.core.chat.fixtures import evil_template

MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello!"},
    {"role": "user", "content": "How are you?"},
]


@pytest.mark.parametrize(
    "template",
    [CHATML_TEMPLATE, ZEPHYR_TEMPLATE, GEMMA_TEMPLATE, PHI3_TEMPLATE],
    ids=["chatml", "zephyr", "gemma", "phi3"],
)
def test_renders_like_transformers(template):
    from transformers.utils.chat_template_utils import render_jinja_template

    want, _ = render_jinja_template(
        conversations=[MSGS],
        chat_template=template,
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
    )
    got = render_chat(template, MSGS, bos_token="<s>", eos_token="</s>")
    assert got.template == "model" and got.warning is None
    assert got.text == want[0]


def test_mistral_template_without_system():
    got = render_chat(MISTRAL_TEMPLATE, MSGS[1:], bos_token="<s>", eos_token="</s>")
    assert got.text == "<s>[INST] Hi there [/INST] Hello!</s>[INST] How are you? [/INST]"


def test_no_template_is_plain_completion():
    got = render_chat(None, [{"role": "user", "content": "Once upon a time"}])
    assert (got.text, got.template, got.warning) == ("Once upon a time", "none", None)
    assert plain_text(MSGS[1:3]) == "Hi thereHello!"


def test_lipsum_globals_exploit_is_refused(canary):
    got = render_chat(evil_template(canary), MSGS, source="evil.gguf")
    assert not canary.exists()
    assert got.template == "fallback"
    assert got.text == fallback_text(MSGS)
    assert "evil.gguf" in got.warning and "sandbox refused" in got.warning and "__globals__" in got.warning


@pytest.mark.parametrize(
    "template",
    [
        "{{ cycler.__init__.__globals__.os.popen('touch CANARY').read() }}",
        "{{ joiner.__init__.__globals__['os'].system('touch CANARY') }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ namespace.__init__.__globals__ }}",
        "{% set x = messages.append({'role': 'user', 'content': 'touch CANARY'}) %}",
        "{{ (messages|first).update({'role': 'x'}) }}",
    ],
    ids=["cycler", "joiner", "mro", "namespace", "append", "update"],
)
def test_other_escapes_are_refused(template, canary):
    got = render_chat(template.replace("CANARY", str(canary)), MSGS)
    assert got.template == "fallback"
    assert "sandbox refused" in got.warning
    assert not canary.exists()


@pytest.mark.parametrize(
    "template, why",
    [
        ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "ran longer"),
        (
            "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxxxx{% endfor %}{% endfor %}",
            "rendered prompt",
        ),
        ("{{ 'a' * 1000000000 }}", "repeated"),
        ("{{ 'x' | center(1000000000) }}", "numeric argument"),
        ("{{ '%999999999d' % 1 }}", "width"),
        ("{{ '{:>999999999}'.format(1) }}", "width"),
        ("{{ 10 ** 10000000 }}", "power"),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
            "concatenation",
        ),
        (
            "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
            "concatenation",
        ),
        (
            "{% set ns = namespace(x=[1]) %}{% for i in range(80) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}",
            "print",
        ),
        (
            "{% set ns = namespace(x=[1]) %}{% for i in range(80) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x|tojson }}",
            "print",
        ),
    ],
    ids=[
        "nested-range",
        "output-size",
        "repeat",
        "center",
        "percent",
        "format",
        "power",
        "tilde",
        "plus",
        "dag",
        "dag-json",
    ],
)
def test_denial_of_service_templates_hit_the_budget(template, why):
    # the output-size case must meet the size limit (100k characters) before the time limit
    budget = 60.0 if why == "rendered prompt" else 0.3
    got = render_chat(template, MSGS, time_budget_s=budget, max_chars=100_000)
    assert got.template == "fallback"
    assert "budget" in got.warning and why in got.warning


@pytest.mark.parametrize(
    "template, why",
    [
        ("{% for m in messages %}{{ m.content }", "syntax error on line 1"),
        ("{{ raise_exception('Only user and assistant roles are supported') }}", "Only user and assistant"),
        ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursion"),
        ("{{ messages[10].content }}", "no element 10"),
        ("{{ 1 + 'a' }}", "failed (TypeError"),
    ],
    ids=["syntax", "raise", "recursion", "undefined", "type-error"],
)
def test_broken_templates_fall_back_with_a_warning(template, why):
    got = render_chat(template, MSGS, source="model.gguf")
    assert got.template == "fallback" and got.text == fallback_text(MSGS)
    assert why in got.warning and "model.gguf" in got.warning


def test_rendering_is_cancellable():
    ctx = JobContext()
    ctx.cancel()
    with pytest.raises(JobCancelled):
        render_chat("{% for i in range(100000) %}{{ i }}{% endfor %}", MSGS, ctx=ctx, time_budget_s=60)


def test_hf_template_helpers_work():
    template = (
        "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
        "{{ m | tojson }}{% generation %}!{% endgeneration %}{% endfor %}"
    )
    got = render_chat(template, MSGS[:2])
    assert got.template == "model"
    assert got.text == '{"role": "user", "content": "Hi there"}!'
