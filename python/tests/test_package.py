"""The package's modules import each other one way: no cycle, counting the
imports inside functions too (a cycle makes a module's import order matter
and hands one module another that is half initialized)."""

import ast
import os

import omnicache as oc

PKG = os.path.dirname(oc.__file__)


def imports():
    """module -> the package's modules it imports (__init__ for names
    imported from the package itself)."""
    mods = {f[:-3] for f in os.listdir(PKG) if f.endswith(".py")}
    ext = {f.split(".")[0] for f in os.listdir(PKG) if f.endswith(".c")}  # C extensions: they import nothing
    graph = {}
    for m in sorted(mods):
        deps = set()
        for n in ast.walk(ast.parse(open(os.path.join(PKG, m + ".py")).read())):
            if isinstance(n, ast.ImportFrom) and n.level == 1:
                if n.module:
                    deps.add(n.module.split(".")[0])
                else:
                    deps.update(a.name if a.name in mods else "__init__" for a in n.names if a.name not in ext)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]
                deps.update(x.split(".")[1] for x in names if x.startswith("omnicache."))
        graph[m] = sorted(d for d in deps if d in mods and d != m)
    return graph


def cycle(graph):
    """A cycle of graph as a list of modules, or None."""
    state, path = {}, []

    def visit(m):
        state[m] = "open"
        path.append(m)
        for d in graph[m]:
            if state.get(d) == "open":
                return path[path.index(d):] + [d]
            if d not in state:
                c = visit(d)
                if c:
                    return c
        state[m] = "done"
        path.pop()
        return None

    for m in graph:
        if m not in state:
            c = visit(m)
            if c:
                return c
    return None


def test_no_import_cycle():
    g = imports()
    assert "_ffi" in g and "core" in g["__init__"]
    assert cycle(g) is None, " -> ".join(cycle(g))


def test_cycle_finds_one():
    assert cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert cycle({"a": ["b", "c"], "b": ["c"], "c": []}) is None


def test_ffi_is_the_bottom():
    """_ffi, the ctypes layer, imports nothing of the package but errors
    (and the C extension, which imports nothing)."""
    assert imports()["_ffi"] == ["errors"]
