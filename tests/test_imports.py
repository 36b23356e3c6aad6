"""No import circle in eagle3/: a circle among module-level imports makes the package's import order matter (a
module half-initialized when its partner reads a name from it). Only module-level imports are counted (those under
`if TYPE_CHECKING:` excepted): they are the ones that run at import time; an import inside a function runs when the
function does, after every module has loaded, and cannot make a circle at import time."""

from __future__ import annotations

import ast
from pathlib import Path

import eagle3

PACKAGE = Path(eagle3.__file__).parent


def module_name(file: Path) -> str:
    parts = ("eagle3", *file.relative_to(PACKAGE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_level_imports(source: str, name: str, package: str, modules: set[str]) -> set[str]:
    """The eagle3 modules that module `name` (in `package`) imports at its top level (`from eagle3.x import y`
    counts eagle3.x.y when that is a module, else eagle3.x); statements inside functions, classes and
    `if TYPE_CHECKING:` do not run then."""
    found: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        statements = [node] if not isinstance(node, (ast.If, ast.Try)) else list(ast.walk(node))
        for st in statements:
            if isinstance(st, ast.Import):
                found |= {a.name for a in st.names}
            elif isinstance(st, ast.ImportFrom):
                base = st.module or ""
                if st.level:  # relative: from the package, one level up per dot past the first
                    parent = package.split(".")[:len(package.split(".")) - st.level + 1]
                    base = ".".join(parent + ([base] if base else []))
                found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in st.names}
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    graph = {}
    for f in files:
        name = module_name(f)
        package = name if f.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = module_level_imports(f.read_text(), name, package, modules)
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


def test_the_walk_sees_a_circle_and_a_deferred_import_breaks_none():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = ("import eagle3.x\nfrom eagle3 import y\nfrom . import v\nif TYPE_CHECKING:\n    import eagle3.z\n"
              "def f():\n    import eagle3.w\n")
    modules = {"eagle3.x", "eagle3.y", "eagle3.z", "eagle3.w", "eagle3.v", "eagle3"}
    assert module_level_imports(source, "eagle3.probe", "eagle3", modules) == {"eagle3.x", "eagle3.y", "eagle3.v"}


def test_no_import_circle_in_eagle3():
    graph = import_graph()
    assert "eagle3.run.launch" in graph and graph["eagle3.run.launch"], "the walk found the package's modules"
    assert cycles(graph) == [], "module-level import circles: " + "; ".join(" -> ".join(c) for c in cycles(graph))


# Line budgets: eagle3/run/launch.py reads top to bottom in one sitting, and every function in eagle3/ fits a screen.
LAUNCH_MAX_LINES, FUNCTION_MAX_LINES = 250, 80


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


def test_launch_is_under_its_line_budget_and_no_function_in_eagle3_is_over_80_lines():
    lines = len((PACKAGE / "run" / "launch.py").read_text().splitlines())
    assert lines < LAUNCH_MAX_LINES, f"eagle3/run/launch.py has {lines} lines (budget: under {LAUNCH_MAX_LINES})"
    long = [f"{file.relative_to(PACKAGE.parent)}: {name} ({length} lines)" for file in sorted(PACKAGE.rglob("*.py"))
            for name, length in long_functions(file.read_text())]
    assert not long, f"functions over {FUNCTION_MAX_LINES} lines: " + "; ".join(long)
