"""Layers only point down and modules import no cycle: every `import` of every module under mindgr/ (module
level and inside functions alike), read with ast, checked against the layer table of docs/ARCHITECTURE.md.

A component is the first name under mindgr (mindgr.train.trainer -> train). It may import its own modules
and those of lower layers; components of one layer do not import each other. The exceptions below are the
only ones, each with its reason; a listed exception that no longer occurs fails the test too (so the list
shrinks as the code is fixed).
"""
import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

# component -> layer (docs/ARCHITECTURE.md); a new package must be placed here before it can be imported.
LAYERS = {
    "__init__": 0, "config": 0, "paths": 0,
    "datasets": 1, "ops": 1, "ids": 1,
    "runtime": 2, "models": 2,
    "generate": 3,
    "train": 4,
    "parallel": 5,
    "serve": 6,
    "bench": 7,
    "cli": 8,
    "__main__": 9,
}

# (importing module, imported module) -> why it stays for now.
EXCEPTIONS = {
}

PACKAGE = REPO / "mindgr"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path, name: str) -> set:
    """The mindgr modules `path` imports (resolved: `from mindgr.ops import backend` -> mindgr.ops.backend
    when that is a module, else mindgr.ops)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in found if m == "mindgr" or m.startswith("mindgr.")}


def _graph():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        graph[name] = {m for m in _imports(path, name) if m in modules and m != name}
    return graph


def _component(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_component_has_a_layer():
    missing = sorted({_component(m) for m in _graph()} - set(LAYERS))
    assert not missing, f"place {missing} in LAYERS (and in docs/ARCHITECTURE.md)"


def test_no_import_points_up_or_sideways():
    bad, seen = [], set()
    for src, targets in _graph().items():
        for dst in sorted(targets):
            a, b = _component(src), _component(dst)
            if a == b or dst == "mindgr" or LAYERS[b] < LAYERS[a]:
                continue
            if (src, dst) in EXCEPTIONS:
                seen.add((src, dst))
                continue
            bad.append(f"{src} ({a}, layer {LAYERS[a]}) imports {dst} ({b}, layer {LAYERS[b]})")
    assert not bad, "\n".join(bad)
    stale = set(EXCEPTIONS) - seen
    assert not stale, f"exceptions that no longer occur, remove them: {sorted(stale)}"


def _cycle(graph):
    """One import cycle as a list of modules, or None (iterative depth-first search)."""
    state = {}
    for root in sorted(graph):
        if root in state:
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        state[root] = "open"
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                path.pop()
                state[node] = "done"
            elif state.get(child) == "open":
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = "open"
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_no_import_cycles():
    graph = _graph()
    # a package's __init__ re-exporting its modules is not a cycle with them (Python imports the package first)
    for name in graph:
        graph[name] = {m for m in graph[name] if not (m != "mindgr" and name.startswith(m + "."))}
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checker_finds_what_it_must():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    graph = _graph()
    assert "mindgr.ops.backend" in graph["mindgr.ops.attention"]     # from-imports resolve to modules
    assert "mindgr.runtime" in graph["mindgr.train.trainer"]
    assert "mindgr.train.table_checkpoint" in graph["mindgr.train.saved_run"]   # lazy imports count


# packages that must stay free of MindSpore (numpy / pyarrow only): what they build runs without a device
NO_MINDSPORE = ("mindgr.ids",)


def _imports_mindspore(path: Path) -> bool:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
        if any(n == "mindspore" or n.startswith("mindspore.") for n in names):
            return True
    return False


def _with_packages(module: str) -> set:
    """The module and the packages Python imports before it (mindgr.ids.trie -> mindgr, mindgr.ids)."""
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _mindspore_importers(root: str, graph: dict, files: dict) -> list:
    """The modules importing mindspore among `root` and every mindgr module it imports, transitively
    (their packages' __init__ included; imports inside functions count)."""
    seen, todo = set(), [root]
    while todo:
        for m in _with_packages(todo.pop()):
            if m in files and m not in seen:
                seen.add(m)
                todo.extend(graph[m])
    return sorted(m for m in seen if _imports_mindspore(files[m]))


def _numpy_only_modules(graph) -> list:
    return sorted(m for m in graph if any(m == p or m.startswith(p + ".") for p in NO_MINDSPORE))


def test_numpy_only_packages_import_no_mindspore():
    """No module of a NO_MINDSPORE package imports mindspore, directly or through the mindgr modules it
    imports."""
    graph = _graph()
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    bad = [f"{root} imports mindspore" + (f" through {m}" if m != root else "")
           for root in _numpy_only_modules(graph) for m in _mindspore_importers(root, graph, files)]
    assert not bad, "\n".join(bad)


def test_numpy_only_packages_load_without_mindspore():
    """The same at run time: importing every module of those packages loads no mindspore."""
    code = ("import importlib, sys\n"
            f"for m in {_numpy_only_modules(_graph())!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in sys.modules if m == 'mindspore' or m.startswith('mindspore.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:300]


def test_the_mindspore_check_finds_what_it_must():
    graph = _graph()
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    assert _imports_mindspore(PACKAGE / "models" / "kv_cache.py")          # `from mindspore import ...`
    assert not _imports_mindspore(PACKAGE / "ids" / "trie.py")
    # the engine imports no mindspore itself, but reaches it through the models it decodes
    assert not _imports_mindspore(PACKAGE / "generate" / "engine.py")
    assert "mindgr.models.kv_cache" in _mindspore_importers("mindgr.generate.engine", graph, files)
    assert _mindspore_importers("mindgr.paths", graph, files) == []
