"""Chat templates rendered only in jinja2's ImmutableSandboxedEnvironment, under a time and size budget.

A chat template comes from the model (tokenizer_config.json or GGUF metadata) and is untrusted code.
It is rendered here and nowhere else, for every back end, so two columns get the same prompt text.
The sandbox refuses access to Python internals (``lipsum.__globals__`` and friends); on top of it
this module counts work: every loop step over ``range``, attribute access, call, filter and
operator checks a deadline, ``*``/``**``/``%``/``+`` and width arguments are checked against the
size budget before they allocate, and the output stops growing at ``max_chars``. Any failure
(refused, over budget, syntax error, ``raise_exception``) falls back to a built-in plain format and
comes with a one-sentence warning naming the template's source.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.compiler
import jinja2.ext
import jinja2.nodes
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

from studio.core.jobs import JobCancelled, JobContext

DEFAULT_TIME_BUDGET_S = 2.0
MIN_OUTPUT_CHARS = 1_000_000
# A format width/precision or numeric argument above this is a memory bomb, not formatting.
_MAX_WIDTH = 100_000
_WIDTH_RE = re.compile(r"%[-+ #0]*(\d+)?(?:\.(\d+))?[a-zA-Z%]")
_FORMAT_SPEC_RE = re.compile(r"\{[^{}]*?:[^{}]*?(\d{6,})")


@dataclass(frozen=True)
class RenderedChat:
    """The prompt text of a conversation and how it was made."""

    text: str
    template: str  # "model": the model's own template; "fallback": it failed; "none": plain completion
    warning: str | None = None


class TemplateBudgetError(Exception):
    """A template needed more time or memory than its budget allows."""


class _Budget:
    def __init__(self, seconds: float, max_chars: int, ctx: JobContext | None) -> None:
        self.deadline = time.monotonic() + seconds
        self.seconds = seconds
        self.max_chars = max_chars
        self.ctx = ctx
        self.steps = 0

    def tick(self) -> None:
        self.steps += 1
        if self.steps & 63 == 0:
            if self.ctx is not None:
                self.ctx.check_cancelled()
            if time.monotonic() > self.deadline:
                raise TemplateBudgetError(f"it ran longer than {self.seconds:g} s")

    def check_size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise TemplateBudgetError(f"{what} would be {n:,} items, over the limit of {self.max_chars:,}")

    def check_args(self, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        for v in (*args, *kwargs.values()):
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > _MAX_WIDTH:
                raise TemplateBudgetError(f"a numeric argument of {v:,} is too large")
            if isinstance(v, str) and _FORMAT_SPEC_RE.search(v):
                raise TemplateBudgetError("a format width is too large")
            if isinstance(v, (list, tuple, dict, set, frozenset)):
                self.check_value(v)

    def check_value(self, value: Any) -> None:
        """Refuse a value whose text form would exceed the size budget (lists may share themselves)."""
        memo: dict[int, int] = {}

        def size(v: Any) -> int:
            if isinstance(v, str):
                return len(v)
            if not isinstance(v, (list, tuple, dict, set, frozenset)):
                return 1
            key = id(v)
            if key in memo:  # shared sub-lists count every time they would be printed
                return memo[key]
            self.tick()
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
            n = len(v) + 1 + sum(size(x) for x in items)
            memo[key] = n
            if n > self.max_chars:
                raise TemplateBudgetError(f"a value would print as more than {self.max_chars:,} characters")
            return n

        size(value)


class _BudgetRange:
    """``range`` for templates: jinja2's size limit plus a budget check on every step."""

    def __init__(self, budget: _Budget, rng: range) -> None:
        self._budget = budget
        self._range = rng

    def __iter__(self) -> Iterator[int]:
        for i in self._range:
            self._budget.tick()
            yield i

    def __len__(self) -> int:
        return len(self._range)

    def __getitem__(self, i: Any) -> Any:
        return self._range[i]

    def __reversed__(self) -> Iterator[int]:
        return iter(_BudgetRange(self._budget, self._range[::-1]))


def _environment(budget: _Budget) -> Any:
    class _Generation(jinja2.ext.Extension):
        # HF templates may mark assistant text with {% generation %}; render its body unchanged.
        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> str:
            return caller()

    class _CodeGen(jinja2.compiler.CodeGenerator):
        # ``a ~ b`` compiles to a plain join that no sandbox hook sees; route it through a checked one.
        def visit_Concat(self, node: Any, frame: Any) -> None:
            if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:
                super().visit_Concat(node, frame)
                return
            self.write("environment.studio_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("))")

    class _Env(ImmutableSandboxedEnvironment):
        code_generator_class = _CodeGen
        intercepted_binops = frozenset({"*", "**", "%", "+"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget.tick()
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
                        budget.check_size(len(seq) * n, "a repeated string or list")
            elif operator == "**":
                if (
                    isinstance(right, (int, float))
                    and abs(right) > 512
                    and isinstance(left, (int, float))
                    and abs(left) > 1
                ):
                    raise TemplateBudgetError(f"the power {left!r} ** {right!r} is too large")
            elif operator == "%" and isinstance(left, str):
                budget.check_value(right)
                for w, p in _WIDTH_RE.findall(left):
                    if (w and int(w) > _MAX_WIDTH) or (p and int(p) > _MAX_WIDTH):
                        raise TemplateBudgetError("a %-format width is too large")
            elif (
                operator == "+"
                and isinstance(left, (str, list, tuple))
                and isinstance(right, (str, list, tuple))
            ):
                budget.check_size(len(left) + len(right), "a concatenation")
            return super().call_binop(context, operator, left, right)

        def studio_concat(self, parts: tuple[Any, ...]) -> str:
            budget.tick()
            for p in parts:
                if not isinstance(p, str):
                    budget.check_value(p)
            budget.check_size(sum(len(p) if isinstance(p, str) else 0 for p in parts), "a ~ concatenation")
            return "".join(str(p) for p in parts)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            budget.tick()
            budget.check_args(args, kwargs)
            bound = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)
            if isinstance(bound, str) and (
                _FORMAT_SPEC_RE.search(bound)
                or _WIDTH_RE.search(bound)
                and any(
                    (w and int(w) > _MAX_WIDTH) or (p and int(p) > _MAX_WIDTH)
                    for w, p in _WIDTH_RE.findall(bound)
                )
            ):
                raise TemplateBudgetError("a format width is too large")
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj: Any, attribute: str) -> Any:
            budget.tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            budget.tick()
            return super().getitem(obj, argument)

    def finalize(value: Any) -> Any:
        # every printed value passes here: refuse one that would print as more than the budget
        if not isinstance(value, str):
            budget.check_value(value)
        return value

    env = _Env(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_Generation, jinja2.ext.loopcontrols],
        finalize=finalize,
    )

    def guard(fn: Any) -> Any:
        @functools.wraps(fn)  # keeps jinja's pass_context/pass_environment marker
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            budget.tick()
            budget.check_args(args, kwargs)
            out = fn(*args, **kwargs)
            if isinstance(out, (str, list, tuple)):
                budget.check_size(len(out), "a filter result")
            return out

        return wrapper

    def tojson(
        x: Any,
        ensure_ascii: bool = False,
        indent: Any = None,
        separators: Any = None,
        sort_keys: bool = False,
    ) -> str:
        # HF's tojson: no HTML escaping, same options
        return json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
        )

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt: str) -> str:
        return datetime.now().strftime(fmt)

    def bounded_range(*args: int) -> _BudgetRange:
        return _BudgetRange(budget, safe_range(*args))

    env.filters["tojson"] = tojson
    env.filters = {name: guard(fn) for name, fn in env.filters.items()}
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["range"] = bounded_range
    return env


def plain_text(messages: Sequence[Any]) -> str:
    """Plain completion for a model without a template: the conversation as one continuing text."""
    return "".join(_content(m) for m in messages)


def fallback_text(messages: Sequence[Any], add_generation_prompt: bool = True) -> str:
    """The built-in format used when a model's template cannot be rendered: ``Role: text`` lines."""
    lines = [f"{_role(m).capitalize()}: {_content(m)}\n" for m in messages]
    if add_generation_prompt:
        lines.append("Assistant:")
    return "".join(lines)


def _role(m: Any) -> str:
    return str(m["role"] if isinstance(m, dict) else m.role)


def _content(m: Any) -> str:
    return str(m["content"] if isinstance(m, dict) else m.content)


def render_chat(
    template: str | None,
    messages: Sequence[Any],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    source: str = "the model",
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    max_chars: int | None = None,
    ctx: JobContext | None = None,
) -> RenderedChat:
    """Render ``messages`` with ``template`` in the sandbox; plain completion when there is none.

    ``messages`` are ``Message`` objects or ``{"role", "content"}`` dicts. A template that is refused,
    over budget or broken gives the built-in format and a warning. Cancelling ``ctx`` raises
    ``JobCancelled``.
    """
    if not template or not template.strip():
        return RenderedChat(plain_text(messages), "none")
    msgs = [{"role": _role(m), "content": _content(m)} for m in messages]
    if max_chars is None:
        max_chars = max(MIN_OUTPUT_CHARS, 4 * sum(len(m["content"]) for m in msgs) + 100_000)
    budget = _Budget(time_budget_s, max_chars, ctx)
    try:
        env = _environment(budget)
        compiled = env.from_string(template)
        parts: list[str] = []
        size = 0
        for piece in compiled.generate(
            messages=msgs,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=add_generation_prompt,
        ):
            size += len(piece)
            budget.check_size(size, "the rendered prompt")
            budget.tick()
            parts.append(piece)
        return RenderedChat("".join(parts), "model")
    except JobCancelled:
        raise
    except SecurityError as err:
        why = f"it tried to reach Python internals and the sandbox refused it ({_short(err)})"
    except TemplateBudgetError as err:
        why = f"it exceeded its rendering budget ({_short(err)})"
    except TemplateSyntaxError as err:
        why = f"it has a syntax error on line {err.lineno} ({_short(err)})"
    except TemplateError as err:
        why = f"it raised an error ({_short(err)})"
    except (MemoryError, RecursionError, OverflowError) as err:
        why = f"it needed too much memory or recursion ({type(err).__name__})"
    except Exception as err:  # noqa: BLE001 - a template is untrusted input; any failure means fallback
        why = f"it failed ({type(err).__name__}: {_short(err)})"
    return RenderedChat(
        fallback_text(messages, add_generation_prompt),
        "fallback",
        f"The chat template of {source} was not used because {why}; a plain built-in format is used instead.",
    )


def _short(err: BaseException, limit: int = 160) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
