"""The package's import structure: every import between eagle3 modules is counted, at module level, inside a
function or under `if TYPE_CHECKING:` alike (a function-local import is an arrow too: it only hides it from import
time). No circle, and no arrow from a lower layer of LAYERS to a higher one. Deferring torch or another library to a
function is fine: that is not an arrow between eagle3 modules."""

from __future__ import annotations

import ast
from pathlib import Path

import eagle3

PACKAGE = Path(eagle3.__file__).parent

# The layers, lowest first: a module imports its own layer or lower ones, never a higher one. A layer is a list of
# modules or packages (a package holds everything under it); docs/development.md's layout section describes each.
LAYERS: list[list[str]] = [
    ["eagle3.errors"],
    # The schema, a leaf: its modules import errors and each other only, in this order; eagle3.config itself (the
    # package's __init__) re-exports them all.
    ["eagle3.config.checks"],
    ["eagle3.config.model", "eagle3.config.data"],
    ["eagle3.config.training"],
    ["eagle3.config.typed"],
    ["eagle3.config"],
    ["eagle3.safe_write", "eagle3.signal_scope", "eagle3.provenance"],
    ["eagle3.console"],
    ["eagle3.formats"],
    ["eagle3.arch"],
    ["eagle3.device"],
    ["eagle3.verifier"],
    ["eagle3.engine"],
    ["eagle3.decoding"],
    ["eagle3.rundir"],
    ["eagle3.plan"],
    ["eagle3.init"],
    ["eagle3.data"],
    ["eagle3.eval"],
    ["eagle3.train"],
    ["eagle3.serve"],
    ["eagle3.sweep"],
    ["eagle3.run"],
    ["eagle3.reference", "eagle3.compare", "eagle3.export"],  # the last two: old paths that name the new verbs
    ["eagle3.cli"],  # the command line, `eagle3 VERB`: the only room that parses arguments
]
# The top room: the only one whose modules may import argparse (a library module takes typed values, not options).
CLI = "eagle3.cli"
# Top-level modules of eagle3/ besides its subpackages (__init__.py not counted).
TOP_LEVEL_MAX = 12


def module_name(file: Path, package: Path = PACKAGE) -> str:
    parts = ("eagle3", *file.relative_to(package).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, name: str, package: str, modules: set[str]) -> set[str]:
    """The eagle3 modules that module `name` (in `package`) imports anywhere in its source: top level, functions,
    classes and `if TYPE_CHECKING:` blocks (`from eagle3.x import y` counts eagle3.x.y when that is a module, else
    eagle3.x)."""
    found: set[str] = set()
    for st in ast.walk(ast.parse(source)):
        if isinstance(st, ast.Import):
            found |= {a.name for a in st.names}
        elif isinstance(st, ast.ImportFrom):
            base = st.module or ""
            if st.level:  # relative: from the package, one level up per dot past the first
                parent = package.split(".")[:len(package.split(".")) - st.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in st.names}
    return {m for m in found if m in modules and m != name}


def import_graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    files = sorted(package.rglob("*.py"))
    modules = {module_name(f, package) for f in files}
    graph = {}
    for f in files:
        name = module_name(f, package)
        within = name if f.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imports_of(f.read_text(), name, within, modules)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each module that is on one (depth-first search; a back edge closes a circle)."""
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def layer_of(module: str, layers: list[list[str]] = LAYERS) -> int | None:
    """The index in `layers` of the longest entry that is `module` or a package above it; None for none."""
    best: tuple[int, int] | None = None
    for i, layer in enumerate(layers):
        for entry in layer:
            if (module == entry or module.startswith(entry + ".")) and (best is None or len(entry) > best[1]):
                best = (i, len(entry))
    return None if best is None else best[0]


def upward_arrows(graph: dict[str, set[str]], layers: list[list[str]] = LAYERS) -> list[str]:
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if (la := layer_of(a, layers)) is not None and (lb := layer_of(b, layers)) is not None and lb > la)


def test_the_walk_counts_every_import_and_sees_circles_and_upward_arrows():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = ("import eagle3.x\nfrom eagle3 import y\nfrom . import v\nif TYPE_CHECKING:\n    import eagle3.z\n"
              "def f():\n    import eagle3.w\nclass C:\n    def m(self):\n        from eagle3.u import name\n")
    modules = {"eagle3.x", "eagle3.y", "eagle3.z", "eagle3.w", "eagle3.v", "eagle3.u", "eagle3"}
    assert imports_of(source, "eagle3.probe", "eagle3", modules) == modules - {"eagle3"}
    layers = [["eagle3.low"], ["eagle3.high", "eagle3.side"]]
    assert layer_of("eagle3.high.deep", layers) == 1 and layer_of("eagle3.lower", layers) is None
    arrows = {"eagle3.low.a": {"eagle3.high.b"}, "eagle3.high.b": {"eagle3.low.a", "eagle3.side"}}
    assert upward_arrows(arrows, layers) == ["eagle3.low.a -> eagle3.high.b"]


def test_no_import_circle_in_eagle3_with_every_import_counted():
    graph = import_graph()
    assert "eagle3.run.launch" in graph and graph["eagle3.run.launch"], "the walk found the package's modules"
    assert cycles(graph) == [], "import circles: " + "; ".join(" -> ".join(c) for c in cycles(graph))


def test_every_module_has_a_layer_and_none_imports_a_higher_layer():
    graph = import_graph()
    without = sorted(m for m in graph if m != "eagle3" and layer_of(m) is None)
    assert not without, f"modules in no layer of LAYERS (add them): {without}"
    arrows = upward_arrows(graph)
    assert not arrows, "imports from a lower layer to a higher one:\n" + "\n".join(arrows)


def test_the_schema_imports_nothing_of_eagle3_but_its_errors():
    graph = import_graph()
    schema = {m for m in graph if m == "eagle3.config" or m.startswith("eagle3.config.")}
    assert len(schema) > 1, "the walk found the schema's modules"
    outside = sorted(f"{m} -> {t}" for m in schema for t in graph[m] if t not in schema | {"eagle3.errors"})
    assert not outside, f"the schema imports other eagle3 modules: {outside}"


def test_eagle3_has_at_most_12_top_level_modules_besides_its_subpackages():
    top = sorted(f.name for f in PACKAGE.glob("*.py") if f.name != "__init__.py")
    assert len(top) <= TOP_LEVEL_MAX, f"{len(top)} top-level modules: {top}"


def test_no_module_outside_the_command_line_imports_argparse():
    parsing = sorted(module_name(f) for f in PACKAGE.rglob("*.py") if not module_name(f).startswith(CLI)
                     and "argparse" in imports_anywhere(f.read_text()))
    assert not parsing, f"library modules importing argparse (its parser belongs in eagle3/cli/): {parsing}"


def imports_anywhere(source: str) -> set[str]:
    """Every module name an import statement of `source` names, anywhere in it."""
    found: set[str] = set()
    for st in ast.walk(ast.parse(source)):
        if isinstance(st, ast.Import):
            found |= {a.name for a in st.names}
        elif isinstance(st, ast.ImportFrom) and st.module and not st.level:
            found.add(st.module)
    return found


def test_the_argparse_walk_sees_an_import_inside_a_function():
    assert "argparse" in imports_anywhere("def f():\n    from argparse import Namespace\n")
    assert "argparse" not in imports_anywhere("x = 'import argparse'\n")


# Line budgets: eagle3/run/launch.py reads top to bottom in one sitting, every function in eagle3/ fits a screen, and
# every module is one job's worth of reading.
LAUNCH_MAX_LINES, FUNCTION_MAX_LINES, MODULE_MAX_LINES = 250, 60, 450
# TEMPORARY: modules and functions over their budgets that other work was changing while the budgets were set. Each
# entry is to be split by job (the issue that set the budgets) and removed from here; a new one is not to be added.
OVER_BUDGET_MODULES: set[str] = set()
OVER_BUDGET_FUNCTIONS: set[str] = set()


def long_functions(source: str, limit: int = FUNCTION_MAX_LINES) -> list[tuple[str, int]]:
    """The functions (methods and nested ones too) of `source` longer than `limit` lines, from `def` to their last
    line, with their lengths."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None
            and node.end_lineno - node.lineno + 1 > limit]


def test_the_walk_sees_a_long_function_nested_or_not():
    body = "".join(f"    x{i} = {i}\n" for i in range(3))
    assert long_functions(f"def f():\n{body}", limit=4) == []
    assert long_functions(f"def f():\n{body}    y = 0\n", limit=4) == [("f", 5)]
    nested = "class C:\n    def m(self):\n" + "".join(f"        x{i} = {i}\n" for i in range(5))
    assert long_functions(nested, limit=4) == [("m", 6)]


def test_launch_is_under_its_line_budget_and_no_function_in_eagle3_is_over_60_lines():
    lines = len((PACKAGE / "run" / "launch.py").read_text().splitlines())
    assert lines < LAUNCH_MAX_LINES, f"eagle3/run/launch.py has {lines} lines (budget: under {LAUNCH_MAX_LINES})"
    long = [f"{file.relative_to(PACKAGE.parent)}: {name} ({length} lines)" for file in sorted(PACKAGE.rglob("*.py"))
            for name, length in long_functions(file.read_text())
            if f"{file.relative_to(PACKAGE.parent)}:{name}" not in OVER_BUDGET_FUNCTIONS]
    assert not long, f"functions over {FUNCTION_MAX_LINES} lines: " + "; ".join(long)


def test_no_module_in_eagle3_is_over_450_lines():
    sizes = {file.relative_to(PACKAGE.parent).as_posix(): len(file.read_text().splitlines())
             for file in sorted(PACKAGE.rglob("*.py"))}
    over = [f"{name} ({lines} lines)" for name, lines in sizes.items()
            if lines > MODULE_MAX_LINES and name not in OVER_BUDGET_MODULES]
    assert not over, f"modules over {MODULE_MAX_LINES} lines (split them by job): " + "; ".join(over)
    back_in_budget = sorted(name for name in OVER_BUDGET_MODULES if sizes.get(name, 0) <= MODULE_MAX_LINES)
    assert not back_in_budget, f"within the budget now, take them off OVER_BUDGET_MODULES: {back_in_budget}"
