"""The house in numbers: packages, the longest import chain, cycles, upward imports, function-local imports.

Builds the import graph of ``studio`` with grimp (the library import-linter runs on; it sees imports
inside functions too) and prints, for ``studio.core`` and ``studio.qt``:

- packages and modules;
- the longest import chain in ``studio.core`` (the longest path through the graph once every cycle
  is collapsed into one node), with its modules;
- import cycles (strongly connected sets of modules), each with one closed chain through it;
- upward imports: a ``studio.core`` module importing one of a higher layer (DESIGN.md's order, below);
- function-local imports in ``studio/`` and ``studio/core``: of the heavy libraries (torch,
  transformers, llama_cpp, huggingface_hub, numba, ray, or a studio module that imports one at its
  top) and of everything else (``--list`` names those).

    python bench/layers.py [--root DIR] [--json] [--list]

``--root`` measures another checkout (the "before" numbers come from an export of the base commit).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import Counter
from pathlib import Path

HEAVY = ("torch", "transformers", "llama_cpp", "huggingface_hub", "numba", "ray")

# DESIGN.md's layers of studio.core, bottom (1) to top (7), by the package (or top-level module) a
# module lives in, as pyproject's import-linter ``layers`` contract orders them (cluster, which runs the
# features' units on Ray, is the top layer there). Top-level modules not named here are vocabulary (1);
# the ones named are where their concept belongs, so that the count means the same before and after
# the move.
LAYER_OF_PACKAGE = {
    "quant": 2,
    "gguf": 2,
    "model": 3,
    "llamacpp": 3,
    "plan": 4,
    "estimate": 4,
    "export": 5,
    "requantize": 5,
    "verify": 5,
    "calib": 6,
    "evaluate": 6,
    "chat": 6,
    "hub": 6,
    "lab": 6,
    "stats": 6,
    "preview": 6,
    "demo": 6,
    "demo_facts": 6,
    "factory": 6,
    "cluster": 7,
}


def contract_layers(root: Path) -> dict[str, int]:
    """The layer of each package of ``studio.core`` in ``root``'s pyproject ``layers`` contract (bottom
    is 1), over ``LAYER_OF_PACKAGE`` (which places the modules of checkouts from before the contract)."""
    import tomllib

    layers = dict(LAYER_OF_PACKAGE)
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        return layers
    config = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    for contract in config.get("tool", {}).get("importlinter", {}).get("contracts", []):
        if contract.get("type") == "layers" and contract.get("containers") == ["studio.core"]:
            for i, names in enumerate(reversed(contract["layers"])):
                layers.update({name.strip(): i + 1 for name in names.split(":")})
    return layers


def layer(module: str, layers: dict[str, int] = LAYER_OF_PACKAGE) -> int:
    """The layer (1 = vocabulary … 6 = features, 7 = cluster) of a ``studio.core`` module."""
    parts = module.split(".")
    return layers.get(parts[2], 1) if len(parts) > 2 else 0


def _function_lines(path: Path) -> set[int]:
    """Line numbers of import statements inside a function body of ``path``."""
    return _lines(path, (ast.FunctionDef, ast.AsyncFunctionDef))


def _type_checking_lines(path: Path) -> set[int]:
    """Line numbers of import statements under ``if TYPE_CHECKING:`` (never run)."""
    return _lines(path, (ast.If,), lambda n: "TYPE_CHECKING" in ast.unparse(n.test))


def _lines(path: Path, kinds: tuple[type, ...], keep=lambda n: True) -> set[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, kinds) and keep(node):
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    lines.add(sub.lineno)
    return lines


def _sccs(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                out.append(sorted(comp))
    return out


def _cycle_through(comp: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One closed chain inside a strongly connected set: from its first module back to it."""
    inside = set(comp)
    start = comp[0]
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ())):
                if w not in inside:
                    continue
                if w == start:
                    chain = [v]
                    while chain[-1] != start:
                        chain.append(prev[chain[-1]])
                    return [start, *reversed(chain[:-1]), start] if len(chain) > 1 else [start, v, start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def _longest_chain(nodes: list[str], edges: dict[str, set[str]]) -> list[str]:
    """The longest import chain, cycles collapsed (a cycle counts as its modules in one step)."""
    comps = _sccs(nodes, edges)
    comp_of = {m: i for i, c in enumerate(comps) for m in c}
    cedges: dict[int, set[int]] = {i: set() for i in range(len(comps))}
    for v, ws in edges.items():
        for w in ws:
            if comp_of[v] != comp_of[w]:
                cedges[comp_of[v]].add(comp_of[w])
    best: dict[int, list[int]] = {}

    def longest(i: int) -> list[int]:
        # Tarjan emits components in reverse topological order, so successors are always done first
        if i not in best:
            tails = [longest(j) for j in cedges[i]]
            best[i] = [i, *max(tails, key=len, default=[])]
        return best[i]

    for i in range(len(comps)):  # components come out successors-first: no deep recursion
        longest(i)
    path = max(best.values(), key=len, default=[])
    return ["+".join(comps[i]) if len(comps[i]) > 1 else comps[i][0] for i in path]


def measure(root: Path) -> dict:
    """Every number this script prints, for the checkout at ``root``."""
    sys.path.insert(0, str(root))
    for name in [m for m in sys.modules if m == "studio" or m.startswith("studio.")]:
        del sys.modules[name]
    import grimp

    graph = grimp.build_graph("studio", include_external_packages=True, cache_dir=None)
    layers = contract_layers(root)
    studio_mods = sorted(m for m in graph.modules if m == "studio" or m.startswith("studio."))
    files = {m: _file_of(root, m) for m in studio_mods}
    local_lines = {m: _function_lines(p) for m, p in files.items() if p is not None}
    typing_lines = {m: _type_checking_lines(p) for m, p in files.items() if p is not None}
    edges: dict[str, set[str]] = {m: set() for m in studio_mods}
    at_top: dict[str, set[str]] = {m: set() for m in studio_mods}  # module-level imports only
    details_of: dict[tuple[str, str], list] = {}
    for importer in studio_mods:
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            details = graph.get_import_details(importer=importer, imported=imported)
            details_of[importer, imported] = details
            runtime_top = local_lines.get(importer, set()) | typing_lines.get(importer, set())
            if any(d["line_number"] not in runtime_top for d in details):
                at_top[importer].add(imported)
    # a studio module is heavy when its module-level imports reach a heavy library (the kernels)
    heavy = set(HEAVY)
    grew = True
    while grew:
        grew = False
        for m in studio_mods:
            if m not in heavy and any(i.split(".")[0] in HEAVY or i in heavy for i in at_top[m]):
                heavy.add(m)
                grew = True
    local: Counter[str] = Counter()
    light_local: list[str] = []
    upward: list[str] = []
    for (importer, imported), details in details_of.items():
        if True:
            if imported in edges:
                edges[importer].add(imported)
            top = imported.split(".")[0]
            for d in details:
                in_function = d["line_number"] in local_lines.get(importer, ())
                if in_function:
                    heavy_line = "safetensors.torch" in d["line_contents"]  # imports torch
                    kind = "heavy" if top in HEAVY or imported in heavy or heavy_line else "light"
                    if kind == "light":
                        light_local.append(f"{importer}:{d['line_number']} {d['line_contents']}")
                    local[f"studio/{kind}"] += 1
                    if importer.startswith("studio.core"):
                        local[f"studio/core/{kind}"] += 1
                if (
                    importer.startswith("studio.core.")
                    and imported.startswith("studio.core.")
                    and layer(imported, layers) > layer(importer, layers) > 0
                ):
                    upward.append(f"{importer}:{d['line_number']} -> {imported}")
    out: dict = {}
    for part in ("studio.core", "studio.qt"):
        mods = [m for m in studio_mods if m == part or m.startswith(part + ".")]
        sub = {m: {w for w in edges[m] if w in mods} for m in mods}
        packages = [m for m in mods if files[m] is not None and files[m].name == "__init__.py"]
        cycles = [c for c in _sccs(mods, sub) if len(c) > 1]
        out[part] = {
            "packages": len(packages),
            "modules": len(mods),
            "cycles": [
                {"modules": len(c), "chain": " -> ".join(_cycle_through(c, sub))}
                for c in sorted(cycles, key=len, reverse=True)
            ],
        }
    core = [m for m in studio_mods if m.startswith("studio.core")]
    chain = _longest_chain(core, {m: {w for w in edges[m] if w.startswith("studio.core")} for m in core})
    out["studio.core"]["longest_chain"] = {"length": len(chain), "chain": " -> ".join(chain)}
    out["studio.core"]["upward_imports"] = {"count": len(upward), "imports": upward}
    out["function_local_imports"] = dict(sorted(local.items()))
    out["light_function_local_imports"] = sorted(light_local)
    # each light one stays for a reason said on its line (a child's side, a POSIX-only or optional module)
    out["light_without_reason"] = sorted(line for line in light_local if "#" not in line)
    out["heavy_studio_modules"] = sorted(m for m in heavy if m.startswith("studio."))
    return out


def _file_of(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    for p in (base / "__init__.py", base.with_suffix(".py")):
        if p.is_file():
            return p
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--json", action="store_true", help="print everything as one JSON object")
    parser.add_argument("--list", action="store_true", help="also list the light function-local imports")
    args = parser.parse_args()
    out = measure(args.root.resolve())
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for part in ("studio.core", "studio.qt"):
        o = out[part]
        print(f"{part}: {o['packages']} packages, {o['modules']} modules, {len(o['cycles'])} cycles")
        for c in o["cycles"]:
            print(f"  cycle of {c['modules']} modules: {c['chain']}")
    lc = out["studio.core"]["longest_chain"]
    print(f"studio.core longest import chain: {lc['length']} modules: {lc['chain']}")
    up = out["studio.core"]["upward_imports"]
    print(f"studio.core upward imports: {up['count']}")
    for line in up["imports"]:
        print(f"  {line}")
    print("function-local imports:", ", ".join(f"{k} {v}" for k, v in out["function_local_imports"].items()))
    print("  (heavy: of torch, transformers, llama_cpp, huggingface_hub, numba, ray, or of a studio module")
    print("   that imports one at its top: " + ", ".join(out["heavy_studio_modules"]) + ")")
    print(f"  light ones without a reason on their line: {len(out['light_without_reason'])}")
    if args.list:
        for line in out["light_function_local_imports"]:
            print(f"  light: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
