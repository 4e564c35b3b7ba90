"""The package's import graph, read with ``ast`` (no import runs): no cycle between modules, and no module imports a
higher layer (codecs know nothing of strategies, strategies nothing of the loop, the loop nothing of build or cli)."""
from __future__ import annotations

import ast
import os

ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "fl_lightning")

# lowest first; a module may import its own package's modules and anything in a lower layer
LAYERS = [
    {"errors", "seeding", "schedule", "messages", "config", "_compat", "threads", "precision", "dist"},
    {"codecs", "optim", "data", "checkpoint", "recorder", "progress", "report"},
    {"server_opt", "models"},
    {"strategies"},
    {"dp"},
    {"step"},
    {"cohort"},
    {"loop"},
    {"run"},
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


# ------------------------------------------------------------------------ no range check outside the vocabulary
# The only hand-written range checks left, by "file:function": each keeps its own refusal for a reason the
# vocabulary (fl_lightning/config/ranges.py: Range, OneOf, a named Validate) cannot serve.
HAND_CHECKS_ALLOWED = {
    # torch.optim's convention: a ValueError for a bad lr or betas; users and tests/unit/optim construct these
    # optimizers in Python, without the config check (their annotations state the same ranges for a config)
    "optim/lion.py:Lion.__init__", "optim/soap.py:SOAP.__init__", "optim/sophia.py:Sophia.__init__",
    # a library function's guard on its own argument (tests/unit/optim/test_newton_schulz.py), not a config key
    "optim/newton_schulz.py:orthogonalize",
}


def _number(n) -> bool:
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
        n = n.operand
    return isinstance(n, ast.Constant) and type(n.value) in (int, float)


def _is_argument(n, args: set[str]) -> bool:
    """``x``, ``float(x)`` / ``int(x)`` or ``self.x`` for an argument ``x`` of the function."""
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("float", "int") and len(n.args) == 1:
        n = n.args[0]
    if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
        return n.attr in args
    return isinstance(n, ast.Name) and n.id in args


def _arguments(fn) -> set[str]:
    """The function's arguments, and the names bound to them (``v = float(x)``; ``for name, v in (("x", x), ...)``)."""
    a = fn.args
    args = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} - {"self", "cls"}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and _is_argument(node.value, args):
            args.add(node.targets[0].id)
        elif isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.iter, (ast.Tuple, ast.List, ast.BinOp)) \
                and any(isinstance(e, ast.Name) and e.id in args for e in ast.walk(node.iter)):
            args |= {t.id for t in ast.walk(node.target) if isinstance(t, ast.Name)}
    return args


def _compares_with_a_number(test, args: set[str]) -> bool:
    for c in ast.walk(test):
        if isinstance(c, ast.Compare):
            sides = [c.left, *c.comparators]
            if any(_number(s) for s in sides) and any(_is_argument(s, args) for s in sides):
                return True
        elif isinstance(c, ast.GeneratorExp) and any(isinstance(g.iter, ast.Name) and g.iter.id in args
                                                     for g in c.generators):  # all(0 <= b < 1 for b in betas)
            inner = args | {t.id for g in c.generators for t in ast.walk(g.target) if isinstance(t, ast.Name)}
            if _compares_with_a_number(c.elt, inner):
                return True
    return False


def _raises_a_config_or_value_error(body) -> bool:
    return any(isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call) and isinstance(n.exc.func, ast.Name)
               and n.exc.func.id in ("ConfigError", "ValueError") for st in body for n in ast.walk(st))


def hand_range_checks(source: str, where: str) -> dict[str, list[str]]:
    """``{"where:Class.function": [the if's test, ...]}``: each ``if`` comparing an argument with a number literal
    whose body raises ConfigError or ValueError (a range the annotations should state)."""
    found: dict[str, list[str]] = {}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = _arguments(child)
                for n in ast.walk(child):
                    if isinstance(n, ast.If) and _compares_with_a_number(n.test, args) and \
                            _raises_a_config_or_value_error(n.body):
                        found.setdefault(f"{where}:{prefix}{child.name}", []).append(
                            f"line {n.lineno}: if {ast.unparse(n.test)}")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def test_no_range_check_outside_the_vocabulary():
    """A range (a bound on a number, a choice of words) is the argument's annotation, ``Annotated[T, Range(...)]`` /
    ``OneOf``, read once with the schema's fields (fl_lightning/config/ranges.py) and checked before anything is
    built; a rule tying two arguments is one named ``Validate`` next to the annotation. No constructor or builder
    restates one in a hand-written ``raise`` (docs/extending.md, "Argument ranges"); the few left are named above."""
    found: dict[str, list[str]] = {}
    for mod, path in modules().items():
        found.update(hand_range_checks(open(path).read(), os.path.relpath(path, ROOT)))
    extra = {k: v for k, v in found.items() if k not in HAND_CHECKS_ALLOWED}
    assert not extra, f"range checks outside the vocabulary (state them as Range/OneOf/Validate): {extra}"
    assert set(found) == HAND_CHECKS_ALLOWED, f"allowed but gone (drop from the list): {HAND_CHECKS_ALLOWED - set(found)}"


def test_the_range_check_scan_finds_a_hand_check():
    """The scan above is not blind: the hand checks it was written against are found."""
    source = '''
class Part:
    def __init__(self, alpha: float = 0.5, betas=(0.9, 0.99), lr=1.0):
        if not 0.0 <= float(alpha) < 1.0:
            raise ConfigError("alpha", "must be in [0, 1)", "use 0.5")
        for name, b in (("beta1", betas[0]), ("beta2", betas[1])):
            if not 0 <= b < 1:
                raise ConfigError(name, "must be in [0, 1)", "use 0.9")
        self.lr = float(lr)
        if not self.lr > 0:
            raise ValueError("lr must be > 0")


def check_beta(name, value):
    v = float(value)
    if not all(0 <= x < 1 for x in value) or v < 0:
        raise ConfigError(name, "bad", "fix")
'''
    found = hand_range_checks(source, "x.py")
    assert set(found) == {"x.py:Part.__init__", "x.py:check_beta"} and len(found["x.py:Part.__init__"]) == 3, found
