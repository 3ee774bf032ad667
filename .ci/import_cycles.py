"""Fail when the project's modules import each other in a cycle (module-level or inside functions).

    python .ci/import_cycles.py [ROOT]       (run by `make lint`, hence by .ci/run)

Every ``import`` and ``from ... import`` of server/, client/, common/, benchmarks/ and tests/ is read
with ``ast`` (nothing is executed); an edge A -> B means module A imports project module B. Cycles
are the strongly connected components of more than one module (Tarjan), printed one per line.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGES = ("server", "client", "common", "benchmarks", "tests")


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Project modules ``module`` imports: ``from a.b import c`` is a.b.c when that is a module, else a.b."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative import
                pkg = module.split(".") if is_package else module.split(".")[:-1]
                pkg = pkg[: len(pkg) - node.level + 1]
                base = ".".join(pkg + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in known:
                    out.add(full)
                elif base in known:
                    out.add(base)
    return out - {module}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else Path(__file__).resolve().parent.parent)
    files = {module_name(root, p): p for pkg in PACKAGES for p in (root / pkg).rglob("*.py") if ".venv" not in p.parts}
    known = set(files)
    graph = {m: imported(ast.parse(p.read_text(), str(p)), m, p.name == "__init__.py", known) for m, p in files.items()}
    found = cycles(graph)
    for c in found:
        print("import cycle: " + " <-> ".join(c))
    print(f"import_cycles: {len(files)} modules, {sum(map(len, graph.values()))} imports, {len(found)} cycle(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
