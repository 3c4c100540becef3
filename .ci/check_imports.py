#!/usr/bin/env python3
"""Checks that data flows one way through the fastload package, as docs/ARCHITECTURE.md draws
it: every module sits in one of the LAYERS below and imports only from its own layer or lower
ones, no import cycle joins modules, nothing imports `fastload.cli` (the command line sits on
top of everything), and no module imports another module's private name (one with a leading
underscore: a helper two modules share belongs, public, in `fastload._checks`). Private
modules themselves (`_core`, `_checks`) are the package's lowest layer and may be imported.

Reads every module under python/fastload with `ast` (nothing is imported, so this runs without
the Rust extension or torch). Every import statement counts, those inside functions included:
a lazy import still makes the two modules depend on each other. `from fastload import x` is an
edge to the submodule `fastload.x` when there is one and to the package `__init__` otherwise;
relative imports resolve against the importing module's package. Importing a submodule runs
its parent packages' `__init__` too, but that is how Python packages work, not a dependency of
the importer, so it adds no edge. Exit status 1, with each problem printed, when the rules are
broken; 0 otherwise.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent / "python"
PACKAGE = "fastload"
TOP = f"{PACKAGE}.cli"

#: From the lowest layer to the highest; a name ending in ".*" covers a package and every
#: module in it. A module imports only modules of its own layer or of lower ones.
LAYERS = [
    (
        "foundation",
        [
            "fastload._core",
            "fastload.errors",
            "fastload._checks",
            "fastload.options",
            "fastload.progress",
            "fastload.files",
        ],
    ),
    ("store", ["fastload.store", "fastload.inspect"]),
    (
        "pipeline",
        [
            "fastload.dataset.*",
            "fastload.decode",
            "fastload.device",
            "fastload.resident",
            "fastload.augment",
            "fastload.preview",
            "fastload.pack.*",
        ],
    ),
    ("applications", ["fastload.train.*", "fastload.monotonic.*", "fastload.bench.*", "fastload.demo"]),
    ("interface", ["fastload", "fastload.cli.*", "fastload.__main__"]),
]


def module_names(root: Path) -> Dict[str, Path]:
    """Every module of the package: dotted name -> file (a package's name is its __init__'s)."""
    names = {}
    # Extension modules (the Rust `_core`) are modules too; they import nothing of the package.
    for path in sorted((root / PACKAGE).rglob("*.pyi")):
        names[".".join(path.relative_to(root).with_suffix("").parts)] = path
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def layer_of(module: str) -> Optional[int]:
    """The index in LAYERS of the layer holding ``module``, or None when none does."""
    for index, (_, names) in enumerate(LAYERS):
        for pattern in names:
            base = pattern[:-2] if pattern.endswith(".*") else pattern
            if module == base or (pattern.endswith(".*") and module.startswith(base + ".")):
                return index
    return None


#: A module's import statements, each with the package its relative imports resolve against.
Statements = List[Tuple[ast.AST, str]]


def import_statements(name: str, path: Path) -> Statements:
    """Every import statement of module ``name`` (those inside functions included), each with
    the package its relative imports resolve against; none for an extension's stub."""
    if path.suffix != ".py":
        return []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return [(node, package) for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def private_imports(name: str, statements: Statements, modules: Dict[str, Path]) -> List[str]:
    """The private names (a leading underscore, not a dunder, not a module) that module
    ``name`` imports from another module of the package."""
    found = []
    for node, package in statements:
        if not isinstance(node, ast.ImportFrom):
            continue
        source = resolve(node, package)
        if not (source == PACKAGE or source.startswith(PACKAGE + ".")):
            continue
        for alias in node.names:
            private = alias.name.startswith("_") and not alias.name.startswith("__")
            if private and f"{source}.{alias.name}" not in modules:
                found.append(f"{name} imports the private name {alias.name} from {source}")
    return found


def resolve(node: ast.ImportFrom, package: str) -> str:
    """The absolute module an ImportFrom reads from (relative imports resolved)."""
    if node.level:
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        return ".".join(base + ([node.module] if node.module else []))
    return node.module or ""


def imports_of(name: str, statements: Statements, modules: Dict[str, Path]) -> Set[str]:
    """The package's modules that module `name` imports."""
    found: Set[str] = set()

    def nearest_module(dotted: str) -> Optional[str]:
        # `import fastload.dataset.plan.x` names a module or something inside one.
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node, package in statements:
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            source = resolve(node, package)
            # `from a import b`: the submodule a.b if there is one, else module a itself.
            targets = [
                f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names
            ]
        for target in targets:
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                module = nearest_module(target)
                if module is not None and module != name:
                    found.add(module)
    return found


def find_cycle(graph: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import cycle (its modules, the first repeated at the end), or None."""
    state: Dict[str, int] = {}  # 1: on the current path, 2: finished
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def problems(root: Path = ROOT) -> List[str]:
    modules = module_names(root)
    statements = {name: import_statements(name, path) for name, path in modules.items()}
    graph = {name: imports_of(name, statements[name], modules) for name in modules}
    found = [
        f"{name} imports {TOP}: nothing may import the command line"
        for name, deps in sorted(graph.items())
        if TOP in deps and name != f"{PACKAGE}.__main__"
    ]
    for name, deps in sorted(graph.items()):
        layer = layer_of(name)
        if layer is None:
            found.append(
                f"{name} is in no layer of .ci/check_imports.py's LAYERS (place it there and in docs/ARCHITECTURE.md)"
            )
            continue
        for dep in sorted(deps):
            dep_layer = layer_of(dep)
            if dep_layer is not None and dep_layer > layer:
                found.append(
                    f"{name} ({LAYERS[layer][0]}) imports {dep} ({LAYERS[dep_layer][0]}), a higher layer"
                )
    for name in sorted(modules):
        found.extend(private_imports(name, statements[name], modules))
    cycle = find_cycle(graph)
    if cycle:
        found.append("import cycle: " + " -> ".join(cycle))
    return found


def main(argv: List[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else ROOT
    found = problems(root)
    for problem in found:
        print(problem, file=sys.stderr)
    if not found:
        print(
            f"imports of {root / PACKAGE}: layers in order, no cycle, no private name shared, nothing imports {TOP}"
        )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
