"""The package's import graph, read with ``ast`` (no import runs): no cycle between modules, and no module imports a
higher layer (codecs know nothing of strategies, strategies nothing of the loop, the loop nothing of build or cli)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fl_lightning")

# lowest first; a module may import its own package's modules and anything in a lower layer
LAYERS = [
    {"errors", "seeding", "schedule", "messages", "config", "_compat", "signals", "threads", "slurm", "peers",
     "precision"},
    {"codecs", "optim", "data", "checkpoint", "client_store", "recorder", "progress", "report"},
    {"server_opt", "models"},
    {"strategies"},
    {"loop", "services", "compiled_step", "graphed_step"},
    {"build"},
    {"cli", "run_dir"},
]


def modules() -> dict[str, str]:
    out = {}
    for dirpath, _, files in os.walk(ROOT):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(ROOT))[:-3].replace(os.sep, ".")
                out[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    edges: dict[str, set[str]] = {}
    for mod, path in mods.items():
        pkg = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                for alias in node.names:
                    cand = f"{target}.{alias.name}"
                    deps.add(cand if cand in mods else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
        edges[mod] = {d for d in deps if d in mods and d != mod}
    return edges


def layer(mod: str) -> int:
    top = mod.split(".")[1] if "." in mod else mod
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{mod}: not in any layer of {__file__}")


def test_every_module_has_a_layer():
    for mod in modules():
        if mod != "fl_lightning":
            layer(mod)


def test_no_upward_import():
    bad = [f"{m} -> {d}" for m, ds in graph().items() if m != "fl_lightning" for d in ds
           if d != "fl_lightning" and layer(d) > layer(m)]
    assert not bad, bad


def test_no_import_cycle():
    edges = graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(m, path):
        state[m] = 1
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, cycles


def test_the_range_vocabulary_imports_only_the_standard_library():
    """fl_lightning/config/ranges.py (Range, OneOf, NonNegative, Positive, Fraction, Betas) is what every constructor
    signature declares its ranges with: it imports neither torch nor omegaconf nor any module of the package."""
    tree = ast.parse(open(os.path.join(ROOT, "config", "ranges.py")).read())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {"." * n.level + (n.module or "") for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"__future__", "collections.abc", "dataclasses", "types", "typing"}, imported


def test_configuration_is_one_package_used_through_its_api():
    """Everything that reads, checks or explains configuration lives in fl_lightning/config/; the rest of the
    package imports only the names its ``__init__`` exports, never a module of it or a private name."""
    edges, mods = graph(), modules()
    inside = {m for m in mods if m == "fl_lightning.config" or m.startswith("fl_lightning.config.")}
    bad = [f"{m} -> {d}" for m, ds in edges.items() if m not in inside for d in ds if d in inside - {"fl_lightning.config"}]
    assert not bad, bad
    import fl_lightning.config as api

    private = []
    for mod, path in mods.items():
        if mod in inside:
            continue
        pkg = mod if path.endswith("__init__.py") else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(open(path).read())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                if ".".join(base + ([node.module] if node.module else [])) == "fl_lightning.config":
                    private += [f"{mod}: {a.name}" for a in node.names if a.name not in api.__all__]
    assert not private, private
