"""The shape of the code base (issue 20's goals): phasefix's import graph has no circle, lazy imports inside
functions included, and no module grows past ~500 lines. Read from the source with `ast`, not by importing it."""
import ast
import sys
from pathlib import Path

from phasefix.paths import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "phasefix"
MAX_LINES = 520


def modules() -> dict[str, Path]:
    out = {}
    for f in PACKAGE.rglob("*.py"):
        parts = list(f.relative_to(PROJECT_ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f
    return out


def import_graph() -> dict[str, set[str]]:
    """module -> the phasefix modules it imports anywhere in its file (a package importing its own submodules is
    not counted: that is how a package exports them)."""
    mods = modules()

    def resolve(name):
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for m, f in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                deps |= {resolve(a.name) for a in node.names if a.name.startswith("phasefix")}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("phasefix"):
                deps.add(resolve(node.module))
                deps |= {resolve(f"{node.module}.{a.name}") for a in node.names}
        graph[m] = {d for d in deps if d and d != m and not d.startswith(m + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[str]:
    """Every circle a depth-first walk meets, as 'a -> b -> a'."""
    state, stack, found = {}, [], []

    def visit(u):
        state[u] = "open"
        stack.append(u)
        for v in sorted(graph.get(u, ())):
            if state.get(v) == "open":
                found.append(" -> ".join(stack[stack.index(v):] + [v]))
            elif v not in state:
                visit(v)
        stack.pop()
        state[u] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert len(graph) > 40 and "phasefix.fit_run" in graph["phasefix.fit"]  # the scan sees the package
    assert circles(graph) == []


def test_a_circle_is_found_when_there_is_one(tmp_path, monkeypatch):
    """The scan itself: two hand-written modules importing each other (one lazily, inside a function)."""
    pkg = tmp_path / "phasefix"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from phasefix.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from phasefix import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    monkeypatch.setattr(sys.modules[__name__], "PROJECT_ROOT", tmp_path)
    graph = import_graph()
    assert graph == {"phasefix": set(), "phasefix.a": {"phasefix.b"}, "phasefix.b": {"phasefix", "phasefix.a"}}
    assert circles(graph) == ["phasefix.a -> phasefix.b -> phasefix.a"]


def test_no_module_is_over_about_500_lines():
    long = {m: n for m, f in modules().items() if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_kernels_stand_alone():
    """No arrow from phasefix/kernels back up into the model (or anything else of phasefix): the kernels import only
    each other and the window grid, a leaf that imports nothing of phasefix; the model imports the grid from there."""
    graph = import_graph()
    kernels = {m for m in graph if m.startswith("phasefix.kernels")}
    assert "phasefix.kernels.compressed_attention.blocked" in kernels  # the scan sees them
    up = {m: sorted(d for d in graph[m] if not d.startswith("phasefix.kernels")) for m in kernels}
    assert {m: d for m, d in up.items() if d} == {}
    assert graph["phasefix.kernels.window_grid"] == set()
    assert "phasefix.kernels.window_grid" in graph["phasefix.model.qwen3"]
