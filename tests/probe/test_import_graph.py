"""The probe package's import graph is acyclic (static scan, function-local imports included).

A cycle hidden in a function body still means two modules each need the
other, i.e. a concept with two homes; deferring the import only hides it.
"""

import ast
from pathlib import Path

import planner.probe

PACKAGE = "planner.probe"
PACKAGE_DIR = Path(planner.probe.__file__).parent


def _module_name(path: Path) -> str:
    return PACKAGE if path.stem == "__init__" else f"{PACKAGE}.{path.stem}"


def _absolute(node: ast.ImportFrom, importer: str) -> str:
    """The module an ImportFrom names, with relative levels resolved against the importer."""
    if node.level == 0:
        return node.module or ""
    is_package = importer == PACKAGE
    base = importer.split(".")[: len(importer.split(".")) - node.level + int(is_package)]
    return ".".join([*base, node.module] if node.module else base)


def _targets(tree: ast.AST, importer: str, modules: set[str]) -> set[str]:
    """Probe modules named by any import statement anywhere in the tree."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, importer)
            # `from planner.probe import report` imports the module planner.probe.report
            names = [module, *(f"{module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(name for name in names if name in modules)
    found.discard(importer)
    # importing planner.probe.x runs planner.probe/__init__ first; that edge is not a dependency
    found.discard(PACKAGE)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE_DIR.glob("*.py"))
    modules = {_module_name(path) for path in paths}
    return {
        _module_name(path): _targets(
            ast.parse(path.read_text(encoding="utf-8")), _module_name(path), modules
        )
        for path in paths
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search with an on-stack set)."""
    done: set[str] = set()

    def visit(module: str, stack: list[str]) -> list[str] | None:
        if module in stack:
            return [*stack[stack.index(module) :], module]
        if module in done:
            return None
        for target in sorted(graph[module]):
            if cycle := visit(target, [*stack, module]):
                return cycle
        done.add(module)
        return None

    for module in sorted(graph):
        if cycle := visit(module, []):
            return cycle
    return None


def test_probe_import_graph_is_acyclic():
    graph = import_graph()
    assert {"planner.probe.command", "planner.probe.launcher"} <= set(graph)
    assert "planner.probe.launcher" in graph["planner.probe.command"], "scan found no edges"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_scan_sees_function_local_imports():
    tree = ast.parse("def f():\n    from planner.probe import report\n")
    modules = {"planner.probe.launcher", "planner.probe.report"}
    assert _targets(tree, "planner.probe.launcher", modules) == {"planner.probe.report"}


def test_find_cycle_reports_a_two_module_cycle():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": set()}
    assert find_cycle(graph) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
