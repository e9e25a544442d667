"""The tree is the architecture: no import runs against the data flow, and no two stages import each other.

Every module under watchdog/ is parsed (not imported) and each import of the package in it, at module level,
inside a function or under TYPE_CHECKING, is resolved to the module it names. Each module belongs to a stage,
the folder it sits in, or is a shared leaf. A module may import its own stage, a stage listed before it in
STAGES and any shared leaf; a shared leaf imports only shared leaves. No module reaches itself around a circle
of imports, inside a stage too (type-only ones count). docs/architecture.md draws the same map.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "vllm_watchdog"
ROOT = Path(__file__).resolve().parent.parent / "watchdog"

# Lowest first. Imports point down this list: a stage uses the machinery below it (the ruler reads through
# promql) and the types of the stages it hands work to (the ruler gives notifiers an OutgoingAlert, the actions
# give the gateway a ThrottleSpec). A receiver never imports its sender, and nothing imports the wiring at the
# top. Each stage's config.py (its section of the config file) belongs to "config", which assembles them.
STAGES = (
    "config",  # the config file, parsed once into frozen dataclasses
    "templates",  # Go text/template for alert labels and annotations, and Go's renderings
    "promql",  # the query engine over the sample store
    "scrapelog",  # what the sources delivered, recorded for replay
    "sources",  # scrapes, probes and GPUs, into the sample store
    "integrity",  # the known-answer probe: are the answers still right
    "notifiers",  # the alert they send, and its delivery
    "ruler",  # rule files, the alert state machine, rule groups
    "gateway",  # the data plane in front of vLLM, which the actions steer
    "fleet",  # the disruption budget a group of watchdogs shares in etcd, which the actions ask
    "actions",  # routes, rails, the remediator and its runtimes
    "discovery",  # targets found in files and labelled containers (a relaunch's kept copy is the runtime's)
    "promtool",  # promtool's rule unit tests
    "api",  # the watchdog's own HTTP API
    "commands",  # replay, plot, top
    "service",  # the daemon, which wires the stages together
    "cli",  # the command line
)

# Modules any stage may import; they import only each other.
SHARED_LEAVES = frozenset(
    f"{PACKAGE}{name}"
    for name in (
        "",  # the package: __version__
        ".background",
        ".errors",
        ".exitcodes",
        ".failpoints",
        ".fdlimits",
        ".formats",  # Go's and Prometheus' text formats, one module each: RFC 3339, strconv, string maps
        ".formats.gostrconv",
        ".formats.rfc3339",
        ".formats.stringmap",
        ".goregex",
        ".jsontext",
        ".listener",
        ".logs",
        ".matchers",
        ".redact",
        ".safetext",
        ".sdnotify",
        ".statehealth",
        ".store",
        ".config.durations",  # the YAML reading helpers every config section and the rule files use
        ".config.files",
        ".config.yamlnodes",
        ".gateway.routes",  # vLLM's route table: the gateway routes by it, its config section checks against it
    )
)

# Modules outside the stage folders.
TOP_LEVEL = {f"{PACKAGE}.cli": "cli", f"{PACKAGE}.__main__": "cli"}

# Imports that still run against the flow: (importer, imported) -> why.
EXCEPTIONS: Mapping[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    """One import of the package: which module imports which, and where."""

    importer: str
    imported: str
    line: int

    def __str__(self) -> str:
        return f"{self.importer} (line {self.line}) imports {self.imported}"


def module_names(root: Path, package: str) -> dict[str, Path]:
    """Every module under `root` by its dotted name (a package by its own name)."""
    out: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def imports_of(name: str, path: Path, modules: Mapping[str, Path], package: str) -> Iterator[Import]:
    """The package modules `name` imports, wherever in the file the import statement is."""
    home = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = home
                for _ in range(node.level - 1):
                    up = up.rpartition(".")[0]
                base = f"{up}.{base}" if base else up
            # `from pkg import name`: name is a submodule, or something pkg defines.
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found = {m for m in (_module_in(target, modules) for target in targets) if m is not None}
        for imported in sorted(found - {name}):
            yield Import(name, imported, node.lineno)


def _module_in(dotted: str, modules: Mapping[str, Path]) -> str | None:
    """The module a dotted name lies in (`pkg.mod.attr` lies in pkg.mod); None outside the package."""
    while dotted not in modules and "." in dotted:
        dotted = dotted.rpartition(".")[0]
    return dotted if dotted in modules else None


@dataclass(frozen=True)
class Layers:
    """Which stage each module is in, and the order of the stages."""

    package: str
    stages: tuple[str, ...]
    leaves: frozenset[str]
    top_level: Mapping[str, str]

    def stage_of(self, name: str) -> str | None:
        """The stage a module belongs to; None for a shared leaf; KeyError for a module in none."""
        if name in self.leaves:
            return None
        if name in self.top_level:
            return self.top_level[name]
        parts = name.split(".")
        if len(parts) >= 2 and parts[0] == self.package and parts[1] in self.stages:
            return "config" if parts[2:] == ["config"] else parts[1]
        raise KeyError(f"{name} is in no stage: put it in a stage folder, or list it in SHARED_LEAVES")

    def against_the_flow(self, imp: Import) -> bool:
        """Whether an import runs against the data flow (exceptions not considered)."""
        src, dst = self.stage_of(imp.importer), self.stage_of(imp.imported)
        if dst is None:
            return False
        if src is None:
            return True  # a shared leaf that imports a stage is no leaf
        return self.stages.index(dst) > self.stages.index(src)

    def cycles(self, imports: Iterable[Import]) -> list[list[str]]:
        """Cycles in the graph of stages importing stages, each as the stages around it."""
        graph: dict[str, set[str]] = {}
        for imp in imports:
            src, dst = self.stage_of(imp.importer), self.stage_of(imp.imported)
            if src is not None and dst is not None and src != dst:
                graph.setdefault(src, set()).add(dst)
        found: list[list[str]] = []
        done: set[str] = set()

        def visit(stage: str, path: list[str]) -> None:
            if stage in path:
                found.append([*path[path.index(stage) :], stage])
                return
            if stage in done:
                return
            for nxt in sorted(graph.get(stage, ())):
                visit(nxt, [*path, stage])
            done.add(stage)

        for stage in sorted(graph):
            visit(stage, [])
        return found


LAYERS = Layers(PACKAGE, STAGES, SHARED_LEAVES, TOP_LEVEL)


@functools.cache
def all_imports(root: Path = ROOT, package: str = PACKAGE) -> tuple[Import, ...]:
    """Every import of the package by every module under `root` (parsed once per session)."""
    modules = module_names(root, package)
    return tuple(imp for name, path in modules.items() for imp in imports_of(name, path, modules, package))


def test_every_module_has_a_stage() -> None:
    unplaced = []
    for name in module_names(ROOT, PACKAGE):
        try:
            LAYERS.stage_of(name)
        except KeyError as exc:
            unplaced.append(str(exc))
    assert not unplaced, unplaced


def test_no_import_runs_against_the_data_flow() -> None:
    wrong = [
        f"{imp}: {LAYERS.stage_of(imp.importer) or 'a shared leaf'} may not import {LAYERS.stage_of(imp.imported)}"
        for imp in all_imports()
        if LAYERS.against_the_flow(imp) and (imp.importer, imp.imported) not in EXCEPTIONS
    ]
    assert not wrong, "\n".join(wrong)


def sections(modules: Iterable[str]) -> set[str]:
    """The config sections: each stage's own config.py outside config/ (config stage by STAGES' rule)."""
    return {
        m for m in modules if len(m.split(".")) == 3 and m.endswith(".config") and m.split(".")[1] != "config"
    }


def test_a_section_imports_no_stage_and_not_the_model_that_assembles_it() -> None:
    """A section reads YAML with the config folder's helpers and shares types with other sections; it never
    reaches the whole Config (config/model.py assembles the sections, so the reverse would be a circle)."""
    found = sections(module_names(ROOT, PACKAGE))
    assert {f"{PACKAGE}.{s}.config" for s in ("actions", "gateway", "notifiers", "fleet", "sources")} <= found
    wrong = [
        str(imp)
        for imp in all_imports()
        if imp.importer in found
        and (
            imp.imported == f"{PACKAGE}.config.model" or LAYERS.stage_of(imp.imported) not in (None, "config")
        )
    ]
    assert not wrong, "\n".join(wrong)
    model = {imp.imported for imp in all_imports() if imp.importer == f"{PACKAGE}.config.model"}
    assert found <= model, f"config/model.py assembles every section: {sorted(found - model)}"


def test_no_two_stages_import_each_other() -> None:
    assert LAYERS.cycles(all_imports()) == []


def module_cycles(imports: Iterable[Import]) -> list[list[str]]:
    """The groups of modules that reach each other through imports (Tarjan's strongly connected
    components of more than one module), each sorted. Type-only imports count: a circle through them is
    still two modules that each need the other."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        graph.setdefault(imp.importer, set()).add(imp.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for nxt in sorted(graph.get(name, ())):
            if nxt not in index:
                visit(nxt)
                low[name] = min(low[name], low[nxt])
            elif nxt in stack:
                low[name] = min(low[name], index[nxt])
        if low[name] == index[name]:
            group = stack[stack.index(name) :]
            del stack[stack.index(name) :]
            if len(group) > 1:
                found.append(sorted(group))

    for name in sorted(graph):
        if name not in index:
            visit(name)
    return sorted(found)


def test_no_module_imports_itself_around_a_circle() -> None:
    assert module_cycles(all_imports()) == []


def test_module_cycles_are_found_through_type_only_imports(tmp_path: Path) -> None:
    files = {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\n",
        "c.py": "def f() -> None:\n    from .a import x\n",
        "d.py": "from . import a\n",
    }
    for rel, text in files.items():
        (tmp_path / "pkg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / rel).write_text(text)
    assert module_cycles(all_imports(tmp_path / "pkg", "pkg")) == [["pkg.a", "pkg.b", "pkg.c"]]


def test_every_exception_is_still_needed() -> None:
    backward = {(imp.importer, imp.imported) for imp in all_imports() if LAYERS.against_the_flow(imp)}
    assert set(EXCEPTIONS) <= backward, sorted(set(EXCEPTIONS) - backward)


def test_the_checks_see_function_level_relative_and_absolute_imports(tmp_path: Path) -> None:
    """A small package: a receiver imports its sender inside a function, and a leaf imports a stage."""
    files = {
        "__init__.py": "",
        "store.py": "",
        "logs.py": "import pkg.ruler.alerting\n",
        "notifiers/__init__.py": "",
        "notifiers/hub.py": "def send() -> None:\n    from ..ruler.alerting import Alert\n",
        "ruler/__init__.py": "",
        "ruler/alerting.py": "from ..notifiers import hub\nfrom .. import store\n",
    }
    for rel, text in files.items():
        (tmp_path / "pkg" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / rel).write_text(text)
    found = all_imports(tmp_path / "pkg", "pkg")
    assert {(i.importer, i.imported, i.line) for i in found} == {
        ("pkg.logs", "pkg.ruler.alerting", 1),
        ("pkg.notifiers.hub", "pkg.ruler.alerting", 2),
        ("pkg.ruler.alerting", "pkg.notifiers.hub", 1),
        ("pkg.ruler.alerting", "pkg.store", 2),
    }
    layers = Layers("pkg", ("notifiers", "ruler"), frozenset({"pkg", "pkg.store", "pkg.logs"}), {})
    backward = {(i.importer, i.imported) for i in found if layers.against_the_flow(i)}
    assert backward == {("pkg.logs", "pkg.ruler.alerting"), ("pkg.notifiers.hub", "pkg.ruler.alerting")}
    assert layers.cycles(found) == [["notifiers", "ruler", "notifiers"]]
    with pytest.raises(KeyError, match=r"pkg\.stray is in no stage"):
        layers.stage_of("pkg.stray")


# gateway/ holds two processes and what they share: the gateway process (dataplane/) and the daemon's side
# (control/) import the protocol (protocol/), never each other, and the protocol imports neither. Outside
# gateway/, only the command line (`vllm-watchdog gateway`) imports the data plane; the daemon's side and the
# protocol load none of its HTTP stacks.
GATEWAY_PARTS: Mapping[str, frozenset[str]] = {
    "dataplane": frozenset({"dataplane", "protocol"}),
    "control": frozenset({"control", "protocol"}),
    "protocol": frozenset({"protocol"}),
}
DATAPLANE_STACKS = frozenset({"aiohttp", "uvicorn", "uvloop", "starlette", "yarl"})


def gateway_part(name: str) -> str | None:
    """Which of gateway/'s sub-packages a module is in; None for one outside them."""
    parts = [*name.split("."), ""]
    return parts[2] if parts[:2] == [PACKAGE, "gateway"] and parts[2] in GATEWAY_PARTS else None


def third_party_of(path: Path) -> set[str]:
    """The top-level names of what a module imports from outside the package (relative imports left out)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found - {PACKAGE}


def test_the_gateway_sides_share_only_the_protocol() -> None:
    wrong = []
    for imp in all_imports():
        src, dst = gateway_part(imp.importer), gateway_part(imp.imported)
        if dst is None:
            continue
        if src is not None and dst not in GATEWAY_PARTS[src]:
            wrong.append(f"{imp}: gateway/{src} may not import gateway/{dst}")
        elif src is None and dst == "dataplane" and LAYERS.stage_of(imp.importer) not in ("gateway", "cli"):
            wrong.append(f"{imp}: only the gateway's entry point and the command line start the data plane")
    for name, path in module_names(ROOT, PACKAGE).items():
        stacks = sorted(third_party_of(path) & DATAPLANE_STACKS)
        if gateway_part(name) in ("control", "protocol") and stacks:
            wrong.append(f"{name} imports {stacks}: the data plane's HTTP stacks")
    assert not wrong, "\n".join(wrong)
    assert {gateway_part(name) for name in module_names(ROOT, PACKAGE)} == {None, *GATEWAY_PARTS}
