#!/usr/bin/env python3
"""Checks that data flows one way through the fastload package: no import cycle among its
modules and no module importing `fastload.cli` (the command line sits on top of everything).

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
from typing import Dict, List, Optional, Set

ROOT = Path(__file__).resolve().parent.parent / "python"
PACKAGE = "fastload"
TOP = f"{PACKAGE}.cli"


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


def imports_of(name: str, path: Path, modules: Dict[str, Path]) -> Set[str]:
    """The package's modules that module `name` imports."""
    if path.suffix != ".py":
        return set()
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found: Set[str] = set()

    def nearest_module(dotted: str) -> Optional[str]:
        # `import fastload.dataset.plan.x` names a module or something inside one.
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            # `from a import b`: the submodule a.b if there is one, else module a itself.
            targets = [
                f"{source}.{a.name}" if f"{source}.{a.name}" in modules else source for a in node.names
            ]
        else:
            continue
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
    graph = {name: imports_of(name, path, modules) for name, path in modules.items()}
    found = [
        f"{name} imports {TOP}: nothing may import the command line"
        for name, deps in sorted(graph.items())
        if TOP in deps and name != f"{PACKAGE}.__main__"
    ]
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
        print(f"imports of {root / PACKAGE}: no cycle, nothing imports {TOP}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
