"""The layering rules of docs/CONTRIBUTING.md, read from the source with ``ast``:

    reference  <-  fp4ref  <-  probes  <-  reports

(a) a module imports only its own layer or lower ones (function-level imports and
    ``importlib.import_module("...")`` strings count); ``fp4ref/__main__.py`` is the one
    exception: it runs the command table of the top layer for ``python -m fp4ref``, and
    nothing imports it;
(b) no underscore name (``_x``, or a module ``_x``) is imported from another top-level package,
    nor read as an attribute of a module imported from one (``G._mul``);
(c) no import cycle between modules (module-level and function-level imports together;
    imports under ``if TYPE_CHECKING:`` never run and do not count).

``ALLOWED`` would list a tolerated violation with its reason (empty since issue 12); an entry
that no longer occurs fails too, so the list cannot go stale.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("reference", "fp4ref", "probes", "reports")      # low -> high
ENTRY_POINT = "fp4ref.__main__"                            # the one upward import, by design

# (rule, importer module, imported module or name) -> why it is still allowed.  Empty: every
# known violation was removed by issue 12; a new entry needs its reason and an issue.
ALLOWED: dict[tuple[str, str, str], str] = {
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, tuple[Path, ast.Module]]:
    out = {}
    for top in LAYERS:
        for p in sorted((ROOT / top).rglob("*.py")):
            out[_module_name(p)] = (p, ast.parse(p.read_text(), str(p)))
    return out


SOURCES = _sources()
MODULES = set(SOURCES)


def _is_package(mod: str) -> bool:
    return SOURCES[mod][0].name == "__init__.py"


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names (relative levels resolved)."""
    if not node.level:
        return node.module or ""
    base = mod.split(".") if _is_package(mod) else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class _Imports(ast.NodeVisitor):
    """Every import of one module: (line, target module, imported name or None); module names
    in string tables; and the local names bound to modules (for the ``G._mul`` check)."""

    def __init__(self, mod: str):
        self.mod, self.found, self.tables, self.aliases = mod, [], [], {}

    def visit_Import(self, node):
        for a in node.names:
            self.found.append((node.lineno, a.name, None))
            if a.asname:
                self.aliases[a.asname] = a.name
            else:
                self.aliases.setdefault(a.name.split(".")[0], a.name.split(".")[0])

    def visit_ImportFrom(self, node):
        base = _resolve(self.mod, node)
        for a in node.names:
            sub = f"{base}.{a.name}"
            if sub in MODULES:            # `from pkg import submodule`
                self.found.append((node.lineno, sub, None))
                self.aliases[a.asname or a.name] = sub
            else:
                self.found.append((node.lineno, base, a.name))

    def visit_If(self, node):
        """``if TYPE_CHECKING:`` imports exist for annotations only: they never run."""
        t = node.test
        if getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING":
            for n in node.orelse:
                self.visit(n)
            return
        self.generic_visit(node)

    def visit_Expr(self, node):
        if not isinstance(node.value, ast.Constant):   # a docstring is prose, not a reference
            self.generic_visit(node)

    def visit_Constant(self, node):
        """A string naming a module ("probes.cli" or "probes.cli:main") in a lookup table is an
        import that runs later (a command table, a lazy export): it counts for (a) and (b)."""
        if isinstance(node.value, str) and _MODREF.fullmatch(node.value):
            target = node.value.split(":")[0]
            if target in MODULES:
                name = node.value.split(":")[1] if ":" in node.value else None
                self.tables.append((node.lineno, target, name))

    def visit_Call(self, node):
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            self.found.append((node.lineno, node.args[0].value, None))
        self.generic_visit(node)


_MODREF = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+(:[A-Za-z_][A-Za-z0-9_]*)?")


def _top(name: str) -> str:
    return name.split(".")[0]


def _layer(name: str) -> int | None:
    return LAYERS.index(_top(name)) if _top(name) in LAYERS else None


def _scan() -> dict[str, list]:
    """(rule, importer, target) -> [file:line, ...] for every violation of (a) and (b), and
    the module graph for (c)."""
    bad: dict[tuple[str, str, str], list[str]] = {}
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for mod, (path, tree) in SOURCES.items():
        v = _Imports(mod)
        v.visit(tree)
        where = lambda ln: f"{path.relative_to(ROOT)}:{ln}"  # noqa: E731
        for ln, target, name in v.found + v.tables:
            if _layer(target) is None:
                continue
            if target in MODULES and target != mod and (ln, target, name) in v.found:
                graph[mod].add(target)   # a table string runs later: not a cycle edge
            if _layer(target) > _layer(mod) and mod != ENTRY_POINT:
                bad.setdefault(("upward", mod, target), []).append(where(ln))
            if _top(target) != _top(mod):
                full = target if name is None else f"{target}.{name}"
                if any(p.startswith("_") and not p.startswith("__") for p in full.split(".")):
                    bad.setdefault(("private", mod, full), []).append(where(ln))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in v.aliases and node.attr.startswith("_") \
                    and not node.attr.startswith("__"):
                target = v.aliases[node.value.id]
                if _layer(target) is not None and _top(target) != _top(mod):
                    bad.setdefault(("private", mod, f"{target}.{node.attr}"), []).append(
                        where(node.lineno))
        if mod != ENTRY_POINT and any(t == ENTRY_POINT for _, t, _ in v.found):
            bad.setdefault(("upward", mod, ENTRY_POINT), []).append(where(0))
    return bad, graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


BAD, GRAPH = _scan()


def _cycle_edges() -> dict[tuple[str, str, str], list[str]]:
    """Each cycle as its edges (rule "cycle"); an allowed edge is removed before the search,
    so one ALLOWED entry names the edge that breaks a known cycle."""
    g = {m: {t for t in ts if ("cycle", m, t) not in ALLOWED} for m, ts in GRAPH.items()}
    out = {}
    for comp in _cycles(g):
        inside = set(comp)
        for m in comp:
            for t in sorted(g[m] & inside):
                out[("cycle", m, t)] = [f"cycle among {', '.join(comp)}"]
    return out


def _report(found: dict) -> str:
    return "\n".join(f"  {rule}: {imp} -> {tgt}  ({'; '.join(w)})"
                     for (rule, imp, tgt), w in sorted(found.items()))


@pytest.mark.parametrize("rule", ["upward", "private"])
def test_imports_run_downward_and_public(rule):
    found = {k: w for k, w in BAD.items() if k[0] == rule and k not in ALLOWED}
    assert not found, (f"{rule} imports (docs/CONTRIBUTING.md, 'Import rules'):\n" + _report(found))


def test_no_import_cycle():
    found = _cycle_edges()
    assert not found, "import cycles (break them; docs/CONTRIBUTING.md):\n" + _report(found)


def test_allowed_list_is_current():
    """Every ALLOWED entry still occurs: a fixed violation leaves the list."""
    stale = [k for k in ALLOWED
             if (k not in BAD) if k[0] != "cycle"] + \
            [k for k in ALLOWED if k[0] == "cycle" and k[2] not in GRAPH.get(k[1], ())]
    assert not stale, "ALLOWED entries that no longer occur (remove them):\n" + \
        "\n".join(f"  {k}" for k in stale)


def test_the_checker_sees_each_kind():
    """The scanner itself, on literal source: an import, a private name, a command-table
    string, a function-level import_module, a TYPE_CHECKING-only import (not counted)."""
    src = ('"""reports.cli"""\nimport reports.cli\nfrom reference.gemm import _mul\n'
           'from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from probes import device\n'
           'TABLE = {"p": "reports.cli:main", "x": "not.a.module"}\n'
           "def f():\n    import importlib\n    importlib.import_module('reference.formats')\n")
    v = _Imports("fp4ref.x")
    v.visit(ast.parse(src))
    assert [(t, n) for _, t, n in v.found] == [("reports.cli", None), ("reference.gemm", "_mul"),
                                               ("typing", "TYPE_CHECKING"), ("importlib", None),
                                               ("reference.formats", None)]
    assert [(t, n) for _, t, n in v.tables] == [("reports.cli", "main"), ("reference.formats", None)]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
