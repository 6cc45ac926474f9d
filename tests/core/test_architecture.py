"""The core must stay GUI-free: importing any studio.core module pulls in no Qt."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import grimp

import studio.core


def _core_modules() -> list[str]:
    return [m.name for m in pkgutil.walk_packages(studio.core.__path__, "studio.core.")]


def test_core_imports_no_qt() -> None:
    mods = _core_modules()
    assert mods, "no core modules found"
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    importlib.import_module(m)\n"
        "bad = sorted(n for n in sys.modules if n.split('.')[0] in ('PySide6', 'pyqtgraph', 'shiboken6')"
        " or n.startswith('studio.qt'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"studio.core imported Qt: {out.stdout.strip()}"


def test_core_sources_never_name_qt() -> None:
    import pathlib

    root = pathlib.Path(studio.core.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        for line in path.read_text(encoding="utf-8").splitlines():
            s = line.strip()
            if s.startswith(("import ", "from ")) and any(
                q in s.split()[1] for q in ("PySide6", "pyqtgraph", "shiboken6", "studio.qt")
            ):
                offenders.append(f"{path.name}: {s}")
    assert not offenders, offenders


def _cycles(graph, package: str) -> list[list[str]]:
    """Every import circle among the modules of ``package``, as one closed chain each."""
    mods = sorted(m for m in graph.modules if m == package or m.startswith(package + "."))
    inside = set(mods)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m) & inside) for m in mods}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    for m in mods:
        if m not in index:
            visit(m)
    chains = []
    for comp in comps:  # name each circle by one closed chain through it: a -> b -> ... -> a
        a, b = comp[0], next(w for w in edges[comp[0]] if w in comp)
        back = graph.find_shortest_chain(importer=b, imported=a)
        chains.append([a, *back])
    return chains


def test_no_import_cycles_in_core_or_qt() -> None:
    """No circle of imports in studio.core or studio.qt, function-local imports included (grimp sees
    every import statement); a failure names each circle as a chain of modules."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 5000))
    graph = grimp.build_graph("studio", cache_dir=None)
    found = [" -> ".join(c) for p in ("studio.core", "studio.qt") for c in _cycles(graph, p)]
    assert not found, "import cycles:\n" + "\n".join(found)


HEAVY = ("torch", "transformers", "llama_cpp", "huggingface_hub", "numba", "ray")


def _imports(node) -> list[tuple[tuple[str, ...], int, bool]]:
    """(what it may name, line, whether inside a function) of every runtime import under ``node``;
    ``from a import b`` may name ``a`` or its submodule ``a.b``."""
    import ast

    out: list[tuple[tuple[str, ...], int, bool]] = []

    def walk(n, in_function: bool) -> None:
        for child in ast.iter_child_nodes(n):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # never runs
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.Import):
                out.extend(((a.name,), child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = (child.module, *(f"{child.module}.{a.name}" for a in child.names))
                out.append((names, child.lineno, in_function))
            walk(child, inner)

    walk(node, False)
    return out


def test_function_local_imports_are_heavy_or_say_why() -> None:
    """Only torch & co. (or a studio module that imports one at its top) are imported inside a
    function; any other function-local import says on its line why it must stay there."""
    import ast
    import pathlib

    root = pathlib.Path(studio.core.__file__).parents[1]
    parsed = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        text = path.read_text(encoding="utf-8")
        parsed[name] = (text.splitlines(), _imports(ast.parse(text)))
    heavy: set[str] = set()

    def is_heavy(names: tuple[str, ...]) -> bool:
        return any(n.split(".")[0] in HEAVY or n in heavy for n in names)

    grew = True
    while grew:  # a studio module whose top imports reach a heavy library is heavy too
        grew = False
        for name, (_, imports) in parsed.items():
            if name not in heavy and any(is_heavy(names) for names, _, local in imports if not local):
                heavy.add(name)
                grew = True
    offenders = [
        f"{name}:{line} {lines[line - 1].strip()}"
        for name, (lines, imports) in parsed.items()
        for names, line, local in imports
        if local and not is_heavy(names) and "#" not in lines[line - 1]
    ]
    assert not offenders, "light function-local imports (import them at the top):\n" + "\n".join(offenders)
