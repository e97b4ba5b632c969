"""Architecture rules, checked statically on the source of planner/ (AST only, nothing imported).

1. No import cycle anywhere in planner/. Every `import` / `from ... import` counts, at
   module level or inside a function, except those under `if TYPE_CHECKING:` (they never
   run). Relative imports are resolved. `from pkg import name` is an edge to the module
   `pkg.name` when that is a module, else to `pkg` itself.
2. planner/cost/ is the bottom layer: pure formulas. It may import the standard library
   (less the I/O and nondeterminism modules in COST_FORBIDDEN_STDLIB), planner.units,
   planner.errors, planner.specs, planner.layout, planner.requests, planner.engines and planner.cost.*,
   nothing else (rich, typer, yaml, torch, pydantic are named, not the only ones refused).
   Type-only imports count here: a signature naming a class from a higher module couples
   cost/ to that module as much as a runtime import does. cost/ also does no I/O (calls to
   open, print, input) and keeps no module-level memo (functools cache / lru_cache
   decorators, `global` statements, module-level dicts, lists, sets or deques that the
   module mutates). A module-level mapping that is only ever read, such as a table of bytes
   per dtype, is a constant and passes. A value derived from one frozen spec may be kept
   on that spec instance (specs.computed_once, Spec.derived: as the spec keeps its own
   hash): it lives and dies with the instance, is keyed by the function and its arguments,
   and cannot change what any call returns.
3. Unit factors live in planner/units.py only. Outside it, a numeric literal that is a
   power-of-ten or power-of-two unit factor is refused (see `unit_literal_reason` for the
   exact rule and UNIT_LITERAL_ALLOWED for the exceptions, each with its reason). Not unit
   factors: the ints 1000 and 1024 unless they scale a quantity whose name carries a unit
   (they are batch sizes and counts as often as kB or KiB); a float of 1e-9 or less that is
   added or subtracted (floating-point slack, as in ceil(span - 1e-9)); anything inside an
   assert's test or a tolerance keyword (rel_tol=1e-9). Strings (docstrings included) and
   comments are never looked at.

Each rule is its own test; a failure lists every offending file:line.
"""

from __future__ import annotations

import ast
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import planner

PLANNER_DIR = Path(planner.__file__).resolve().parent
COST_PACKAGE = "planner.cost"
UNITS_MODULE = "planner.units"

# ------------------------------------------------------------------------------ source model


@dataclass(frozen=True)
class Module:
    name: str
    """Dotted name, e.g. planner.cost.comm (a package's __init__.py is the package)."""
    path: Path
    is_package: bool
    rel: str
    """Path as reported in failures: relative to the directory holding the package."""
    source: str
    tree: ast.Module


def module_name(path: Path, root: Path) -> tuple[str, bool]:
    """(dotted name, is package) of a .py file under `root`'s parent."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def load_modules(root: Path) -> dict[str, Module]:
    """Every .py file of the package at `root`, parsed."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        with tokenize.open(path) as handle:  # honours a coding cookie, like the interpreter
            source = handle.read()
        name, is_package = module_name(path, root)
        rel = path.relative_to(root.parent).as_posix()
        modules[name] = Module(name, path, is_package, rel, source, ast.parse(source, str(path)))
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """`if TYPE_CHECKING:` or `if typing.TYPE_CHECKING:`."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


@dataclass(frozen=True)
class ImportStmt:
    node: ast.Import | ast.ImportFrom
    type_checking_only: bool


def import_statements(tree: ast.AST) -> Iterator[ImportStmt]:
    """Every import statement, at any depth, marked when it sits under `if TYPE_CHECKING:`
    (the `else:` branch of such an `if` runs, so it is not marked)."""

    def visit(node: ast.AST, guarded: bool) -> Iterator[ImportStmt]:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield ImportStmt(node, guarded)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                yield from visit(child, True)
            for child in node.orelse:
                yield from visit(child, guarded)
            return
        for child in ast.iter_child_nodes(node):
            yield from visit(child, guarded)

    yield from visit(tree, False)


def resolve_from(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module a `from X import ...` names (relative levels resolved)."""
    if node.level == 0:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    parts = package.split(".")
    if node.level > 1:
        parts = parts[: len(parts) - (node.level - 1)]
    base = ".".join(parts)
    return f"{base}.{node.module}" if node.module else base


def imported_names(module: Module, stmt: ImportStmt, known: set[str]) -> list[str]:
    """Absolute names this statement imports: for `from pkg import x`, `pkg.x` when that is
    a known module (a submodule), else `pkg`."""
    node = stmt.node
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = resolve_from(module, node)
    names = []
    for alias in node.names:
        candidate = f"{base}.{alias.name}"
        names.append(candidate if candidate in known else base)
    return names


# ------------------------------------------------------------------------------ rule 1: cycles


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    where: str
    """file:line of the import statement."""


def import_graph(modules: dict[str, Module]) -> dict[str, dict[str, Edge]]:
    """Module -> imported planner module -> the first statement that imports it (runtime
    imports only: `if TYPE_CHECKING:` bodies never run)."""
    known = set(modules)
    graph: dict[str, dict[str, Edge]] = {name: {} for name in modules}
    for module in modules.values():
        for stmt in import_statements(module.tree):
            if stmt.type_checking_only:
                continue
            for name in imported_names(module, stmt, known):
                target = _known_module(name, known)
                if target is not None and target not in graph[module.name]:
                    where = f"{module.rel}:{stmt.node.lineno}"
                    graph[module.name][target] = Edge(module.name, target, where)
    return graph


def _known_module(name: str, known: set[str]) -> str | None:
    """The longest known module `name` denotes (planner.cost.comm.x -> planner.cost.comm)."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


def strongly_connected(graph: dict[str, dict[str, Edge]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components in a deterministic order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return sorted(components)


def cycle_in(component: list[str], graph: dict[str, dict[str, Edge]]) -> list[Edge]:
    """One concrete cycle through the component's first module (breadth-first: shortest)."""
    members = set(component)
    start = component[0]
    parents: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for target, edge in sorted(graph[node].items()):
                if target not in members:
                    continue
                if target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, parents[path[0].source])
                    return path
                if target not in parents:
                    parents[target] = edge
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle found in component {component}")  # our bug


def import_cycles(modules: dict[str, Module]) -> list[list[Edge]]:
    graph = import_graph(modules)
    cycles = []
    for component in strongly_connected(graph):
        if len(component) > 1 or component[0] in graph[component[0]]:
            cycles.append(cycle_in(component, graph))
    return cycles


def describe_cycle(cycle: list[Edge]) -> str:
    steps = " -> ".join(f"{edge.source} ({edge.where})" for edge in cycle)
    return f"{steps} -> {cycle[0].source}"


# ------------------------------------------------------------------------------ rule 2: cost/ stays pure

COST_ALLOWED_PLANNER = (
    "planner.units",
    "planner.errors",
    "planner.specs",
    "planner.layout",
    "planner.requests",
    "planner.engines",  # the engine release table: pure data the emitters read as well
    COST_PACKAGE,
)
"""Planner modules cost/ may import (each also covers its submodules)."""
COST_FORBIDDEN_STDLIB = frozenset(
    {"os", "sys", "io", "pathlib", "subprocess", "shutil", "tempfile", "json", "time", "random"}
)
"""Standard-library modules that mean I/O, the environment, the clock or randomness."""
COST_NAMED_FORBIDDEN = frozenset({"rich", "typer", "yaml", "torch", "pydantic"})
"""Third-party packages a reviewer would first expect to creep in (all refused anyway)."""
COST_IO_CALLS = frozenset({"open", "print", "input"})
CACHE_DECORATORS = frozenset({"lru_cache", "cache"})
MUTABLE_FACTORIES = frozenset(
    {"dict", "list", "set", "defaultdict", "OrderedDict", "Counter", "deque", "bytearray"}
)
MUTATING_METHODS = frozenset(
    {
        "append",
        "extend",
        "insert",
        "update",
        "setdefault",
        "pop",
        "popitem",
        "clear",
        "add",
        "discard",
        "remove",
        "appendleft",
        "extendleft",
        "popleft",
        "sort",
        "reverse",
    }
)


def cost_modules(modules: dict[str, Module]) -> list[Module]:
    return [
        m
        for name, m in sorted(modules.items())
        if name == COST_PACKAGE or name.startswith(COST_PACKAGE + ".")
    ]


def cost_import_reason(name: str) -> str | None:
    """Why cost/ may not import the absolute module `name` (None: allowed)."""
    top = name.split(".")[0]
    if top == "planner":
        if any(
            name == allowed or name.startswith(allowed + ".") for allowed in COST_ALLOWED_PLANNER
        ):
            return None
        return f"{name} is above cost/ (allowed: {', '.join(COST_ALLOWED_PLANNER)})"
    if top in COST_FORBIDDEN_STDLIB:
        return f"{name}: I/O, environment, clock or randomness"
    if top in COST_NAMED_FORBIDDEN:
        return f"{name}: UI, file or framework dependency"
    if top in sys.stdlib_module_names:
        return None
    return f"{name}: not the standard library"


def cost_import_violations(modules: dict[str, Module]) -> list[str]:
    known = set(modules)
    found = []
    for module in cost_modules(modules):
        for stmt in import_statements(module.tree):
            for name in imported_names(module, stmt, known):
                reason = cost_import_reason(name)
                if reason is not None:
                    kind = " (type-only)" if stmt.type_checking_only else ""
                    found.append(f"{module.rel}:{stmt.node.lineno}: imports {reason}{kind}")
    return found


def io_call_violations(module: Module) -> list[str]:
    found = []
    for node in ast.walk(module.tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else None
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id == "builtins"
        ):
            name = func.attr
        if name in COST_IO_CALLS:
            found.append(f"{module.rel}:{node.lineno}: calls {name}()")
    return found


def _decorator_name(decorator: ast.expr) -> str | None:
    """lru_cache for @lru_cache, @lru_cache(maxsize=...), @functools.lru_cache(...)."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return None


def _is_mutable_container(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp | ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = (
            func.id
            if isinstance(func, ast.Name)
            else func.attr
            if isinstance(func, ast.Attribute)
            else None
        )
        return name in MUTABLE_FACTORIES
    return False


def _module_level_containers(tree: ast.Module) -> dict[str, int]:
    """Names bound at module level to a mutable container -> line."""
    found = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and _is_mutable_container(stmt.value):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    found[target.id] = stmt.lineno
        elif (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and _is_mutable_container(stmt.value)
        ):
            found[stmt.target.id] = stmt.lineno
    return found


def _mutations(tree: ast.Module, names: set[str]) -> dict[str, int]:
    """Names among `names` the module mutates anywhere -> first line that does."""
    found: dict[str, int] = {}

    def hit(name: str, line: int) -> None:
        if name in names:
            found[name] = min(line, found.get(name, line))

    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                hit(target.value.id, node.lineno)
            if isinstance(node, ast.AugAssign) and isinstance(target, ast.Name):
                hit(target.id, node.lineno)
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.attr in MUTATING_METHODS
        ):
            hit(node.func.value.id, node.lineno)
    return found


def module_cache_violations(module: Module) -> list[str]:
    found = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for decorator in node.decorator_list:
                name = _decorator_name(decorator)
                if name in CACHE_DECORATORS:
                    found.append(
                        f"{module.rel}:{decorator.lineno}: @{name} on {node.name}() "
                        "(a memo that outlives the call)"
                    )
        if isinstance(node, ast.Global):
            found.append(f"{module.rel}:{node.lineno}: global {', '.join(node.names)}")
    containers = _module_level_containers(module.tree)
    for name, line in sorted(_mutations(module.tree, set(containers)).items()):
        found.append(
            f"{module.rel}:{containers[name]}: module-level {name} is mutated "
            f"(line {line}): hidden state"
        )
    return found


# ------------------------------------------------------------------------------ rule 3: unit literals

SI_EXPONENTS = frozenset({3, 6, 9, 12, 15})
"""Exponents of ten that are SI prefixes (k, M, G, T, P and their inverses m, u, n, p, f)."""
UNIT_FLOAT_VALUES = frozenset(float(10**e) for e in SI_EXPONENTS) | frozenset(
    10.0**-e for e in SI_EXPONENTS
)
UNIT_INT_VALUES = frozenset({10**6, 10**9, 10**12, 10**15, 2**20, 2**30, 2**40, 2**50})
"""Integer literals that can only be unit factors."""
AMBIGUOUS_INT_FACTORS = frozenset({1000, 1024})
"""As ints these are as often counts (a batch of 1024, 1000 examples) as kB or KiB: flagged
only where they scale a quantity whose name carries a unit (see _names_a_unit)."""
UNIT_WORDS = frozenset(
    {
        "bytes",
        "byte",
        "bits",
        "gbit",
        "seconds",
        "second",
        "ms",
        "us",
        "ns",
        "flops",
        "tflops",
        "kb",
        "mb",
        "gb",
        "tb",
        "kib",
        "mib",
        "gib",
        "tib",
        "units",
    }
)
"""Words of an identifier (split at underscores, lower-cased) that say it carries a unit; the
planner's naming rule puts the unit in every name (weight_bytes_per_gpu, latency_seconds)."""
EPSILON_MAX = 1e-9
"""A float literal this small that is added or subtracted is floating-point slack
(math.ceil(span - 1e-9)), not a unit: no quantity in the planner is a nanosecond or a
nanobyte, and adding a unit factor to a number would be dimensionally meaningless."""
TOLERANCE_KEYWORDS = frozenset({"rel_tol", "abs_tol", "rtol", "atol", "tol", "eps", "epsilon"})

UNIT_LITERAL_ALLOWED: dict[tuple[str, str, str], str] = {
    (
        "planner/cost/continuous_batching.py",
        "<module>",
        "1e-6",
    ): "a probability floor (IN_FLIGHT_WEIGHT_FLOOR): Poisson chances below a millionth are dropped",
    (
        "planner/render/explain.py",
        "breakdown_lines",
        "1e-9",
    ): "relative tolerance: segments under a billionth of the step are not drawn",
    (
        "planner/specs.py",
        "<module>",
        "2**20",
    ): "a count, not a unit factor: at most 1,048,576 GPUs in a cluster (a plausibility bound)",
}
"""(file, enclosing function qualname or "<module>", literal as written) -> why it is not a
unit factor. Keyed by function rather than line so that it survives edits."""


def _literal_text(source_lines: list[str], node: ast.AST) -> str:
    line = source_lines[node.lineno - 1]
    if node.end_lineno == node.lineno and node.end_col_offset is not None:
        return line.encode()[node.col_offset : node.end_col_offset].decode()
    return ast.unparse(node)


def _spelled_exponent(text: str) -> int | None:
    """The decimal exponent a float literal is written with: 300e9 -> 9, 38E-6 -> -6."""
    lowered = text.lower().replace("_", "")
    if lowered.startswith("0x") or "e" not in lowered:
        return None
    try:
        return int(lowered.split("e", 1)[1])
    except ValueError:
        return None


def _int_constant(node: ast.expr) -> int | None:
    """An int literal, or minus one."""
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        inner = _int_constant(node.operand)
        return None if inner is None else -inner
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    ):
        return node.value
    return None


def _names_a_unit(node: ast.AST) -> bool:
    """Does the expression name a quantity with a unit (or the units module)?"""
    for sub in ast.walk(node):
        name = (
            sub.id
            if isinstance(sub, ast.Name)
            else sub.attr
            if isinstance(sub, ast.Attribute)
            else None
        )
        if name is not None and UNIT_WORDS & set(name.lower().split("_")):
            return True
    return False


def unit_literal_reason(node: ast.AST, parent: ast.AST | None) -> bool:
    """Is this node an inline unit factor?

    - a float literal equal to 1e3, 1e6, ... 1e15 or 1e-3 ... 1e-15 (however written: 1e9,
      1_000_000.0, 0.001), or any float literal written with an SI exponent (300e9 is
      "300 G", 38e-6 is "38 u": a human unit converted inline);
    - an int literal equal to 10**6, 10**9, 10**12, 10**15, 2**20, 2**30, 2**40, 2**50;
    - the int 1000 or 1024 multiplying or dividing an expression whose name carries a unit
      (kv_bytes_per_token(model) / 1024, units.BYTES_PER_GB // 1000);
    - a power of two int literals: 10**k and 10**-k for k in 3, 6, 9, 12, 15; 2**k for k a
      multiple of 10; 1000**k and 1024**k for k >= 2.
    The caller (unit_literal_violations) knows the source text (for spelled exponents).
    """
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        base, exponent = _int_constant(node.left), _int_constant(node.right)
        if base is None or exponent is None:
            return False
        return (
            (base == 10 and abs(exponent) in SI_EXPONENTS)
            or (base == 2 and exponent >= 10 and exponent % 10 == 0)
            or (base in (1000, 1024) and exponent >= 2)
        )
    if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
        return False
    if isinstance(node.value, float):
        return node.value in UNIT_FLOAT_VALUES
    if isinstance(node.value, int):
        if node.value in UNIT_INT_VALUES:
            return True
        if (
            node.value in AMBIGUOUS_INT_FACTORS
            and isinstance(parent, ast.BinOp)
            and isinstance(parent.op, ast.Mult | ast.Div | ast.FloorDiv)
        ):
            other = parent.right if parent.left is node else parent.left
            return _names_a_unit(other)
    return False


def _is_epsilon(node: ast.AST, parent: ast.AST | None) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, float)
        and 0 < node.value <= EPSILON_MAX
        and isinstance(parent, ast.BinOp)
        and isinstance(parent.op, ast.Add | ast.Sub)
    )


def _exempt_subtrees(tree: ast.AST) -> set[int]:
    """ids of nodes inside an assert's test or a tolerance keyword argument: there a 1e-9 is
    a float-comparison tolerance in a bug check, not a unit."""
    exempt: set[int] = set()
    for node in ast.walk(tree):
        roots: list[ast.AST] = []
        if isinstance(node, ast.Assert):
            roots = [node.test]
        elif isinstance(node, ast.Call):
            roots = [kw.value for kw in node.keywords if kw.arg in TOLERANCE_KEYWORDS]
        for root in roots:
            exempt.update(id(sub) for sub in ast.walk(root))
    return exempt


def _scopes_and_parents(tree: ast.Module) -> tuple[dict[int, str], dict[int, ast.AST]]:
    """id(node) -> qualname of the innermost enclosing function or class ("<module>" at top),
    and id(node) -> its parent node."""
    scopes: dict[int, str] = {}
    parents: dict[int, ast.AST] = {}

    def visit(node: ast.AST, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = scope
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                inner = child.name if scope == "<module>" else f"{scope}.{child.name}"
            scopes[id(child)] = inner
            parents[id(child)] = node
            visit(child, inner)

    visit(tree, "<module>")
    return scopes, parents


def unit_literal_violations(module: Module) -> list[str]:
    lines = module.source.splitlines()
    exempt = _exempt_subtrees(module.tree)
    scopes, parents = _scopes_and_parents(module.tree)
    found = []
    covered: set[int] = set()  # the operands of a flagged 2**30 are not reported again
    for node in ast.walk(module.tree):
        if id(node) in exempt or id(node) in covered:
            continue
        parent = parents.get(id(node))
        flagged = unit_literal_reason(node, parent)
        if not flagged and isinstance(node, ast.Constant) and isinstance(node.value, float):
            exponent = _spelled_exponent(_literal_text(lines, node))
            flagged = exponent is not None and abs(exponent) in SI_EXPONENTS
        if not flagged or _is_epsilon(node, parent):
            continue
        covered.update(id(sub) for sub in ast.walk(node))
        literal, scope = _literal_text(lines, node), scopes.get(id(node), "<module>")
        if (module.rel, scope, literal) in UNIT_LITERAL_ALLOWED:
            continue
        found.append(f"{module.rel}:{node.lineno}: {literal} in {scope}")
    return sorted(found, key=_file_line_key)


def _file_line_key(entry: str) -> tuple[str, int]:
    path, line, _ = entry.split(":", 2)
    return path, int(line)


# ------------------------------------------------------------------------------ the tests

MODULES = load_modules(PLANNER_DIR)


def _fail_with(title: str, found: list[str]) -> None:
    """Fail listing every offender, one per line (no repr of the list after it)."""
    if found:
        pytest.fail(f"{title} ({len(found)}):\n  " + "\n  ".join(found), pytrace=False)


def test_planner_is_scanned() -> None:
    """The scan sees the package (a wrong path would make every rule pass vacuously)."""
    assert {"planner.cli", "planner.units", "planner.cost.comm"} <= set(MODULES)
    assert len(cost_modules(MODULES)) >= 5


def test_no_import_cycles() -> None:
    cycles = [describe_cycle(cycle) for cycle in import_cycles(MODULES)]
    _fail_with(
        "import cycles in planner/ (each: module (file:line of its import of the next) -> ...)",
        cycles,
    )


def test_cost_imports_only_the_layers_below() -> None:
    found = cost_import_violations(MODULES)
    _fail_with(
        f"planner/cost/ imports outside the stdlib and {', '.join(COST_ALLOWED_PLANNER)}", found
    )


def test_cost_does_no_io() -> None:
    found = [v for m in cost_modules(MODULES) for v in io_call_violations(m)]
    _fail_with("I/O calls in planner/cost/", found)


def test_cost_keeps_no_module_level_caches() -> None:
    found = [v for m in cost_modules(MODULES) for v in module_cache_violations(m)]
    _fail_with(
        "module-level caches or state in planner/cost/ (memoise per search and pass it down)", found
    )


def test_no_unit_literals_outside_units() -> None:
    found = [
        v
        for name, m in sorted(MODULES.items())
        if name != UNITS_MODULE
        for v in unit_literal_violations(m)
    ]
    _fail_with(
        "unit factors outside planner/units.py (use a named constant or converter from it)", found
    )


# ------------------------------------------------------------------------------ the checkers themselves


def _fake_package(tmp_path: Path, files: dict[str, str]) -> dict[str, Module]:
    root = tmp_path / "pkg"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return load_modules(root)


def test_checker_finds_a_cycle_through_a_function_local_relative_import(tmp_path: Path) -> None:
    modules = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg import b\n",
            "sub/__init__.py": "",
            "sub/c.py": "def f():\n    from .. import a\n",
            "b.py": "import pkg.sub.c as c\n",
        },
    )
    cycles = import_cycles(modules)
    assert len(cycles) == 1
    text = describe_cycle(cycles[0])
    assert text.startswith("pkg.a (pkg/a.py:1) -> pkg.b (pkg/b.py:1) -> pkg.sub.c (pkg/sub/c.py:2)")
    assert text.endswith("-> pkg.a")


def test_checker_ignores_type_checking_imports(tmp_path: Path) -> None:
    modules = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import B\n",
            "b.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n"
                "else:\n    pass\nclass B: ...\n"
            ),
        },
    )
    assert import_cycles(modules) == []


def test_checker_cost_rules(tmp_path: Path) -> None:
    modules = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "cost/__init__.py": "",
            "cost/x.py": (
                "import math, os\nfrom functools import lru_cache\nfrom planner import train\n"
                "from planner.cost import comm\nBYTES = {'fp8': 1}\n_memo = {}\n"
                "@lru_cache(maxsize=8)\ndef f(n):\n    _memo[n] = n\n    print(n)\n    return BYTES['fp8']\n"
            ),
        },
    )
    cost = [m for m in modules.values() if m.name == "pkg.cost.x"][0]
    assert cost_import_reason("math") is None and cost_import_reason("planner.cost.comm") is None
    assert cost_import_reason("os") is not None and cost_import_reason("numpy") is not None
    assert cost_import_reason("planner.train") is not None
    assert cost_import_reason("planner.layout") is None
    assert [v.split(": ", 1)[1] for v in io_call_violations(cost)] == ["calls print()"]
    caches = module_cache_violations(cost)
    assert len(caches) == 2, caches  # the decorator and _memo; BYTES is only read
    assert any("@lru_cache on f()" in v for v in caches)
    assert any("module-level _memo is mutated (line 9)" in v for v in caches)


def test_checker_unit_literals(tmp_path: Path) -> None:
    modules = _fake_package(
        tmp_path,
        {
            "__init__.py": "",
            "m.py": (
                "A = 1e9\nB = 300e9\nC = 38e-6\nD = 2**30\nE = 10**-6\nF = 1_000_000\n"
                "G = 1024**3\nH = 0.001\nI = weight_bytes / 1024\nJ = 544 * units.BYTES_PER_GB // 1000\n"
                "K = 20e-6 + x\n"
                "ok = [1024, 1000, 0.5, 1e-10, 2**5, 128, [2**k for k in ()], 1.5e-4, 0x10]\n"
                "def f(x):\n    assert x <= 1 + 1e-9 * x\n    n = math.ceil(x - 1e-9) + lru(maxsize=1024)\n"
                "    return isclose(x, 1, rel_tol=1e-9) or num_seqs * 1000\n"
                "'''1e9 in a docstring'''  # 2**30 in a comment\n"
            ),
        },
    )
    found = unit_literal_violations(modules["pkg.m"])
    assert [v.split(": ", 1)[1] for v in found] == [
        "1e9 in <module>",
        "300e9 in <module>",
        "38e-6 in <module>",
        "2**30 in <module>",
        "10**-6 in <module>",
        "1_000_000 in <module>",
        "1024**3 in <module>",
        "0.001 in <module>",
        "1024 in <module>",
        "1000 in <module>",
        "20e-6 in <module>",
    ]
