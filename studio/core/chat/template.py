"""Chat templates rendered only in jinja2's ImmutableSandboxedEnvironment, under one time and size budget.

A chat template comes from the model (tokenizer_config.json or GGUF metadata) and is untrusted code.
It is rendered here and nowhere else, for every back end and for calibration, so two columns get the
same prompt text. The sandbox refuses access to Python internals (``lipsum.__globals__`` and
friends); on top of it this module counts work: every ``for`` iteration (over anything: a string,
a list, ``range``), attribute access, call, filter and operator checks a deadline, and the size a
``*``/``**``/``%``/``+``/``~``, a ``replace``/``join``/``indent``/``format``/… filter or a
``str`` method would produce is estimated and checked against the size budget *before* it is
allocated; the output stops growing at ``max_chars``.

Rendering runs in a child process (``template_worker``): a deadline or Cancel ends it even when it
is stuck inside C code, and the child has a memory limit. Any failure (refused, over budget, killed,
syntax error, ``raise_exception``) falls back to a built-in plain format and comes with a
one-sentence warning naming the template's source.
"""

from __future__ import annotations

import functools
import itertools
import json
import re
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
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
_MAX_INT_BITS = 1 << 16  # an integer beyond 65,536 bits is an arithmetic bomb, not a template value
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
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.max_chars = max_chars
        self.ctx = ctx
        self.steps = 0

    def reset(self, seconds: float, max_chars: int) -> None:
        """A fresh budget for the next conversation (the environment is reused)."""
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.max_chars = max_chars
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
                raise TemplateBudgetError(f"a numeric argument of {_int_text(v)} is too large")
            if isinstance(v, str) and _FORMAT_SPEC_RE.search(v):
                raise TemplateBudgetError("a format width is too large")
            if isinstance(v, (list, tuple, dict, set, frozenset)):
                self.check_value(v)

    def size_of(self, value: Any) -> int:
        """The length ``value`` would print as, bounded: refused once over the size budget."""
        memo: dict[int, int] = {}

        def size(v: Any) -> int:
            if isinstance(v, str):
                return len(v)
            if isinstance(v, int) and not isinstance(v, bool):
                return v.bit_length() // 3 + 2
            if not isinstance(v, (list, tuple, dict, set, frozenset)):
                return 1
            key = id(v)
            if key in memo:  # shared sub-lists count every time they would be printed
                return memo[key]
            self.tick()
            items = [*v.keys(), *v.values()] if isinstance(v, dict) else v
            n = len(v) + 1
            for x in items:
                n += size(x)
                if n > self.max_chars:
                    raise TemplateBudgetError(
                        f"a value would print as more than {self.max_chars:,} characters"
                    )
            memo[key] = n
            return n

        return size(value)

    def check_value(self, value: Any) -> None:
        """Refuse a value whose text form would exceed the size budget (lists may share themselves)."""
        self.size_of(value)


def _int_text(v: int) -> str:
    # a huge int has no decimal text (Python refuses over 4,300 digits, and it is quadratic below)
    return f"{v:,}" if v.bit_length() < 64 else f"about 2**{v.bit_length()}"


def _count(s: str, sub: str, limit: int | None = None) -> int:
    n = len(s) + 1 if sub == "" else s.count(sub)
    return n if limit is None or limit < 0 else min(n, limit)


def _precheck_str_op(budget: _Budget, name: str, s: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Estimate, before it runs, the size of the string a filter or ``str`` method named ``name``
    makes from ``s``; refuse it when over the budget."""
    a = list(args)

    def arg(i: int, key: str, default: Any) -> Any:
        return a[i] if len(a) > i else kwargs.get(key, default)

    est = len(s)
    if name == "replace":
        old, new, count = str(arg(0, "old", "")), str(arg(1, "new", "")), arg(2, "count", None)
        est = len(s) + _count(s, old, count if isinstance(count, int) else None) * max(0, len(new) - len(old))
    elif name == "indent":
        width = arg(0, "width", 4)
        w = len(width) if isinstance(width, str) else int(width) if isinstance(width, int) else 0
        est = len(s) + (s.count("\n") + 1) * w
    elif name == "wordwrap":
        width, wrap = arg(0, "width", 79), arg(3, "wrapstring", None)
        lines = len(s) // max(1, width if isinstance(width, int) else 1) + s.count(" ") + s.count("\n") + 1
        est = len(s) + lines * (len(wrap) if isinstance(wrap, str) else 1)
    elif name == "expandtabs":
        tab = arg(0, "tabsize", 8)
        est = len(s) + s.count("\t") * (tab if isinstance(tab, int) else 8)
    elif name == "translate":
        table = arg(0, "table", None)
        if isinstance(table, dict):
            longest = max((len(v) if isinstance(v, str) else 1 for v in table.values()), default=1)
            est = len(s) * max(1, longest)
    elif name in ("format", "format_map"):
        # every field may print the largest argument
        fields = s.count("%") + s.count("{")
        vals = [*a, *kwargs.values()]
        if name == "format_map" and vals and isinstance(vals[0], dict):
            vals = list(vals[0].values())
        biggest = max((budget.size_of(v) for v in vals), default=0)
        est = len(s) + fields * biggest
    elif name in ("escape", "e", "forceescape", "urlencode", "tojson", "pprint"):
        est = 6 * len(s)
    budget.check_size(est, f"the result of {name}")


def _precheck_join(budget: _Budget, value: Any, sep: Any) -> Any:
    """The items ``join`` would join (a lazy iterable is read, bounded), after checking the joined size."""
    if isinstance(value, str):
        n, total = len(value), len(value)
    else:
        if not isinstance(value, (list, tuple)):
            value = list(itertools.islice(_ticking(budget, value), budget.max_chars + 1))
        n = len(value)
        total = 0
        for x in value:
            total += len(x) if isinstance(x, str) else budget.size_of(x)
            budget.check_size(total, "a join")
    sep_len = len(sep) if isinstance(sep, str) else budget.size_of(sep)
    budget.check_size(total + max(0, n - 1) * sep_len, "a join")
    return value


def _ticking(budget: _Budget, it: Iterable[Any]) -> Iterator[Any]:
    for x in it:
        budget.tick()
        yield x


class _Ticking:
    """What a template's ``for`` loops over: the same items, with a budget tick per step."""

    def __init__(self, budget: _Budget, value: Any) -> None:
        self._budget = budget
        self._value = value

    def __iter__(self) -> Iterator[Any]:
        return _ticking(self._budget, self._value)

    def __len__(self) -> int:
        return len(self._value)


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
        intercepted_binops = frozenset({"*", "**", "%", "+", "//", "/"})

        def _parse(self, source: str, name: Any, filename: Any) -> Any:
            # every ``for`` loops over a ticking view of its sequence: a loop over a 1 MB string
            # (or anything else that is not ``range``) counts each step against the deadline
            tree = super()._parse(source, name, filename)
            for loop in tree.find_all(jinja2.nodes.For):
                loop.iter = jinja2.nodes.Filter(
                    loop.iter, "studio_ticking", [], [], None, None, lineno=loop.lineno
                )
            return tree

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            budget.tick()
            ints = all(isinstance(v, int) and not isinstance(v, bool) for v in (left, right))
            if operator == "*":
                if ints and left.bit_length() + right.bit_length() > _MAX_INT_BITS:
                    raise TemplateBudgetError("a product of integers is too large")
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and not isinstance(n, bool):
                        budget.check_size(len(seq) * n, "a repeated string or list")
            elif operator == "**":
                if isinstance(right, (int, float)) and isinstance(left, (int, float)) and abs(left) > 1:
                    bits = max(1, int(abs(left)).bit_length()) * abs(right)
                    if abs(right) > 512 or (isinstance(left, int) and bits > _MAX_INT_BITS):
                        raise TemplateBudgetError(
                            f"the power {_short(repr(left), 40)} ** {_short(repr(right), 40)} is too large"
                        )
            elif operator == "%" and isinstance(left, str):
                for w, p in _WIDTH_RE.findall(left):
                    if (w and int(w) > _MAX_WIDTH) or (p and int(p) > _MAX_WIDTH):
                        raise TemplateBudgetError("a %-format width is too large")
                # each field may print the largest value (``'%(a)s' * 1000 % {'a': big}``)
                vals = (
                    right
                    if isinstance(right, tuple)
                    else list(right.values())
                    if isinstance(right, dict)
                    else [right]
                )
                biggest = max((budget.size_of(v) for v in vals), default=0)
                budget.check_size(len(left) + left.count("%") * biggest, "a %-format")
            elif operator == "+":
                if isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
                    budget.check_size(len(left) + len(right), "a concatenation")
                elif ints and max(left.bit_length(), right.bit_length()) > _MAX_INT_BITS:
                    raise TemplateBudgetError("a sum of integers is too large")
            return super().call_binop(context, operator, left, right)

        def studio_concat(self, parts: tuple[Any, ...]) -> str:
            budget.tick()
            total = 0
            for p in parts:
                total += len(p) if isinstance(p, str) else budget.size_of(p)
            budget.check_size(total, "a ~ concatenation")
            return "".join(str(p) for p in parts)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            budget.tick()
            budget.check_args(args, kwargs)
            inner = getattr(__obj, "__wrapped__", __obj)
            bound = getattr(inner, "__self__", None)
            if isinstance(bound, str):
                if _FORMAT_SPEC_RE.search(bound) or any(
                    (w and int(w) > _MAX_WIDTH) or (p and int(p) > _MAX_WIDTH)
                    for w, p in _WIDTH_RE.findall(bound)
                ):
                    raise TemplateBudgetError("a format width is too large")
                method = getattr(inner, "__name__", "")
                if method == "join" and args:
                    args = (_precheck_join(budget, args[0], bound), *args[1:])
                else:
                    _precheck_str_op(budget, method, bound, args, kwargs)
            out = super().call(__context, __obj, *args, **kwargs)
            if isinstance(out, (str, list, tuple)):
                budget.check_size(len(out), "a call result")
            return out

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

    def guard(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        # filters get the eval context / environment first when marked so; the value follows
        skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0

        @functools.wraps(fn)  # keeps jinja's pass_context/pass_environment marker
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            budget.tick()
            budget.check_args(args[skip + 1 :], kwargs)
            if len(args) > skip:
                value, rest = args[skip], args[skip + 1 :]
                if name == "join":
                    sep = rest[0] if rest else kwargs.get("d", "")
                    args = (*args[:skip], _precheck_join(budget, value, sep), *rest)
                elif name == "sum":
                    value = value if isinstance(value, (list, tuple)) else list(_ticking(budget, value))
                    total = sum(len(x) if isinstance(x, (str, list, tuple)) else 1 for x in value)
                    budget.check_size(total, "a sum")
                    args = (*args[:skip], value, *rest)
                elif isinstance(value, str):
                    _precheck_str_op(budget, name, value, rest, kwargs)
                elif name in ("tojson", "pprint", "string", "escape", "e", "forceescape", "urlencode"):
                    budget.check_size(6 * budget.size_of(value), f"the result of {name}")
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

    def bounded_range(*args: int) -> range:
        return safe_range(*args)  # each step is ticked by the ``for`` that runs over it

    env.filters["tojson"] = tojson
    env.filters = {name: guard(name, fn) for name, fn in env.filters.items()}
    env.filters["studio_ticking"] = lambda value: _Ticking(budget, value)
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


def message_dicts(messages: Sequence[Any]) -> list[dict[str, str]]:
    """``messages`` (Message objects or dicts) as plain ``{"role", "content"}`` dicts."""
    return [{"role": _role(m), "content": _content(m)} for m in messages]


def _max_chars(msgs: Sequence[dict[str, str]], max_chars: int | None) -> int:
    if max_chars is not None:
        return max_chars
    return max(MIN_OUTPUT_CHARS, 4 * sum(len(m["content"]) for m in msgs) + 100_000)


def _fallback(messages: Sequence[Any], add_generation_prompt: bool, source: str, why: str) -> RenderedChat:
    return RenderedChat(
        fallback_text(messages, add_generation_prompt),
        "fallback",
        f"The chat template of {source} was not used because {why}; a plain built-in format is used instead.",
    )


class TemplateEngine:
    """One chat template compiled once in the budgeted sandbox, rendering conversation after conversation
    in this process (``render_chats`` runs it in a child process; use that for untrusted templates)."""

    def __init__(self, template: str, source: str = "the model", ctx: JobContext | None = None) -> None:
        self.source = source
        self.budget = _Budget(DEFAULT_TIME_BUDGET_S, MIN_OUTPUT_CHARS, ctx)
        self.broken: str | None = None  # why the template cannot be used at all (syntax, budget)
        self._compiled: Any = None
        try:
            self.budget.reset(DEFAULT_TIME_BUDGET_S, MIN_OUTPUT_CHARS)
            self._compiled = _environment(self.budget).from_string(template)
        except JobCancelled:
            raise
        except Exception as err:  # noqa: BLE001 - a template is untrusted input
            self.broken = _why(err)

    def render(
        self,
        messages: Sequence[Any],
        *,
        bos_token: str = "",
        eos_token: str = "",
        add_generation_prompt: bool = True,
        time_budget_s: float = DEFAULT_TIME_BUDGET_S,
        max_chars: int | None = None,
    ) -> RenderedChat:
        """One conversation; the built-in format and a warning when the template fails.

        A template over its budget is not tried again for later conversations (they would cost the
        same); one that raises for this conversation only is.
        """
        if self.broken is not None:
            return _fallback(messages, add_generation_prompt, self.source, self.broken)
        msgs = message_dicts(messages)
        self.budget.reset(time_budget_s, _max_chars(msgs, max_chars))
        try:
            parts: list[str] = []
            size = 0
            for piece in self._compiled.generate(
                messages=msgs,
                bos_token=bos_token,
                eos_token=eos_token,
                add_generation_prompt=add_generation_prompt,
            ):
                size += len(piece)
                self.budget.check_size(size, "the rendered prompt")
                self.budget.tick()
                parts.append(piece)
            return RenderedChat("".join(parts), "model")
        except JobCancelled:
            raise
        except Exception as err:  # noqa: BLE001 - a template is untrusted input; any failure means fallback
            why = _why(err)
            if isinstance(err, (TemplateBudgetError, MemoryError, RecursionError)):
                self.broken = why
            return _fallback(messages, add_generation_prompt, self.source, why)


def _why(err: BaseException) -> str:
    if isinstance(err, SecurityError):
        return f"it tried to reach Python internals and the sandbox refused it ({_short(err)})"
    if isinstance(err, TemplateBudgetError):
        return f"it exceeded its rendering budget ({_short(err)})"
    if isinstance(err, TemplateSyntaxError):
        return f"it has a syntax error on line {err.lineno} ({_short(err)})"
    if isinstance(err, TemplateError):
        return f"it raised an error ({_short(err)})"
    if isinstance(err, (MemoryError, RecursionError, OverflowError)):
        return f"it needed too much memory or recursion ({type(err).__name__})"
    return f"it failed ({type(err).__name__}: {_short(err)})"


def _short(err: Any, limit: int = 160) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
