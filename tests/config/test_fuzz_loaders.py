"""Fuzz harness: the config, include, rule-file and rule-unit-test loaders on mutated and random YAML.

Every loader must either succeed or raise ConfigError whose every problem names a file the loader read, a
line inside that file (1 to its line count + 1) and a field, with a message; never KeyError, TypeError,
AttributeError, RecursionError or any other exception.

Inputs:

* the real files: watchdog/defaults/config.yml, deploy/watchdog.yml, deploy/demo/watchdog.yml (configs),
  watchdog/defaults/watchdog.yml (an included file), rules/*.rules.yml, deploy/demo/rules.yml and the rule files under
  tests/fixtures/ruletests (rule files), and the rule unit-test files under rules/tests and
  tests/fixtures/ruletests;
* tree mutations of them (loaded, edited, dumped again): a value replaced by a random YAML value or by another
  value from the corpus (type confusion with realistic values), a key deleted, renamed to another key the
  corpus uses or to an unknown one, a value wrapped in a list or unwrapped, emptied or nulled;
* text mutations of them: characters inserted, deleted or replaced, lines duplicated, dropped or re-indented,
  anchors, aliases and tags spliced in (these mostly exercise the YAML-syntax path);
* random YAML documents over the corpus' key vocabulary, and deeply nested flow or block collections.

A config is parsed from a file in a scratch directory that also holds a mutated copy of watchdog/defaults/watchdog.yml
(`inc.yml`) and a mutated rule file (`r.yml`), so `include:` and `rule_files:` reach mutated files as well as
the bundled ones. An accepted config's rule files are loaded too (as the daemon's load_all does). An accepted
rule file is built into a RuleManager over a store holding one sample of every metric its rules read, and
every group is evaluated twice, so that what the loader accepts is also what the evaluator and the alert
templates can run.

Excluded: include and rule_files paths are never absolute or `~`-relative (a fuzzer must not read the
machine's files or block on a device); the environment for `${VAR}` is fixed.
"""

from __future__ import annotations

import copy
import math
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from tests.support.clock import T0
from tests.support.fuzzing import fuzz
from vllm_watchdog.config.model import parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.promql.engine import Engine, vector_query
from vllm_watchdog.promtool.testfile import parse_test_file
from vllm_watchdog.ruler.files import history_needed, load_rule_files, parse_rule_file, store_needs
from vllm_watchdog.ruler.groups import RuleManager, RuleManagerOptions
from vllm_watchdog.store import SampleStore, make_labels

ROOT = Path(__file__).resolve().parents[2]
RULETESTS = ROOT / "tests" / "fixtures" / "ruletests"
CONFIGS = [ROOT / "watchdog" / "defaults" / "config.yml", ROOT / "deploy" / "watchdog.yml"]
CONFIGS += [ROOT / "deploy" / "demo" / "watchdog.yml"]
INCLUDED = ROOT / "watchdog" / "defaults" / "watchdog.yml"
RULES = [
    ROOT / "rules" / "vllm.rules.yml",
    ROOT / "rules" / "gateway.rules.yml",
    ROOT / "deploy/demo/rules.yml",
]
RULES += [RULETESTS / name for name in ("alerts.yml", "error_rules.yml", "staleness_rules.yml")]
TESTFILES = sorted((ROOT / "rules" / "tests").glob("*.yml"))
TESTFILES += sorted(p for p in RULETESTS.glob("*.yml") if p.name.startswith(("pass_", "fail_", "invalid_")))
ENV = {"VLLM_WATCHDOG_TOKEN": "t0ken", "X": "1"}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


CORPUS = {
    "config": [_text(p) for p in CONFIGS],
    "include": [_text(INCLUDED)],
    "rules": [_text(p) for p in RULES],
    "tests": [_text(p) for p in TESTFILES],
}
# libyaml, when there, makes the strategies' own loading and dumping ~10x cheaper; the loaders under test use
# their own (pure-Python, depth-limited) loader whatever this is.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
PARSED = {text: yaml.load(text, Loader=_LOADER) for texts in CORPUS.values() for text in texts}
_ALL_DOCS = list(PARSED.values())


def _walk(value: Any) -> Iterator[Any]:
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


_SUBTREES = [v for doc in _ALL_DOCS for v in _walk(doc)]
KEYS = sorted({str(k) for v in _SUBTREES if isinstance(v, dict) for k in v})
_SCALAR_TEXTS = sorted({v for v in _SUBTREES if isinstance(v, str) and len(v) < 200})

# PyYAML counts a line at each of these (YAML 1.1 line breaks), so its marks do too.
_YAML_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")

# --- checking -----------------------------------------------------------------------------------------------


def check_error(exc: ConfigError, readable: dict[str, str]) -> None:
    """Every problem names a file that was read, a line inside it, a field and a message."""
    assert exc.problems, "a ConfigError without problems"
    for p in exc.problems:
        if p.file not in readable:
            path = Path(p.file)
            assert path.is_file(), f"problem names a file that does not exist: {p}"
            readable[p.file] = path.read_text(encoding="utf-8", errors="replace")
        lines = len(_YAML_BREAK.findall(readable[p.file])) + 1
        assert 1 <= p.line <= lines + 1, f"line {p.line} outside 1..{lines + 1}: {p}"
        assert p.field, f"no field: {p}"
        assert p.message, f"no message: {p}"
        assert str(p) == f"{p.file}:{p.line}: {p.field}: {p.message}"


def loads_cleanly(load: Callable[[], object], readable: dict[str, str]) -> object | None:
    """load() or None after a well-formed ConfigError; any other exception fails the test."""
    try:
        return load()
    except ConfigError as exc:
        check_error(exc, readable)
        return None


# --- strategies ---------------------------------------------------------------------------------------------

_SAFE_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12).filter(
    lambda s: not s.startswith(("/", "~"))
)
_TRICKY = [
    "",
    "0",
    "-1",
    "0s",
    "-5m",
    "1y",
    "1e3",
    "5m30s",
    "99999999999999999999d",
    "1.5",
    "nan",
    ".inf",
    "true",
    "off",
    "null",
    "~x",
    "${X}",
    "${NOPE}",
    "${NOPE:-5s}",
    "$$",
    "${",
    "http://127.0.0.1:1",
    "http://",
    "ftp://h",
    "127.0.0.1:0",
    "127.0.0.1:8080",
    "[::1]:9460",
    "bundled:watchdog.yml",
    "bundled:vllm.rules.yml",
    "bundled:nope.yml",
    "bundled:../rules",
    "inc.yml",
    "r.yml",
    "*.yml",
    "missing.yml",
    ".",
    "up == 0",
    "sum(",
    "rate(x[5m]) > 0",
    "{{ $value }}",
    "{{ .Bad",
    "{{ range }}",
    "1MiB",
    "-1KiB",
    "interactive",
    "restart",
    "throttle",
    "webhook",
]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    _SAFE_TEXT,
    st.sampled_from(_TRICKY),
    st.sampled_from(_SCALAR_TEXTS),
)
YAML_KEYS = st.one_of(st.sampled_from(KEYS), _SAFE_TEXT, st.integers(-3, 3), st.none(), st.booleans())
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(YAML_KEYS, inner, max_size=3),
    max_leaves=8,
)


def _paths(value: Any, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield here
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*here, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*here, i))


def _replace(doc: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    parent[path[-1]] = new
    return doc


@st.composite
def tree_mutation(draw: st.DrawFn, text: str) -> str:
    """The document after 1-4 structural edits, dumped as YAML."""
    doc = copy.deepcopy(PARSED[text])
    for _ in range(draw(st.integers(1, 4))):
        paths = list(_paths(doc))
        path = draw(st.sampled_from(paths))
        parent: Any = doc
        for step in path[:-1]:
            parent = parent[step]
        current = parent[path[-1]] if path else doc
        op = draw(st.sampled_from(["random", "corpus", "delete", "rename", "wrap", "unwrap", "empty", "dup"]))
        if op == "random":
            doc = _replace(doc, path, draw(VALUES))
        elif op == "corpus":
            doc = _replace(doc, path, copy.deepcopy(draw(st.sampled_from(_SUBTREES))))
        elif op == "delete" and path and isinstance(parent, dict):
            del parent[path[-1]]
        elif op == "delete" and path and isinstance(parent, list):
            parent.pop(path[-1])
        elif op == "rename" and path and isinstance(parent, dict):
            parent[draw(YAML_KEYS)] = parent.pop(path[-1])
        elif op == "wrap":
            doc = _replace(doc, path, [current])
        elif op == "unwrap" and isinstance(current, list | dict) and current:
            first = current[0] if isinstance(current, list) else next(iter(current.values()))
            doc = _replace(doc, path, first)
        elif op == "empty":
            doc = _replace(doc, path, draw(st.sampled_from([None, "", [], {}])))
        elif op == "dup" and isinstance(current, list) and current:
            current.append(current[draw(st.integers(0, len(current) - 1))])
    # Copies, not YAML aliases: an alias would make later edits of one occurrence change every one.
    return _dump(doc, sort_keys=False, allow_unicode=draw(st.booleans()))


def _dump(doc: Any, **options: Any) -> str:
    return yaml.dump(doc, Dumper=_DUMPER, width=10**6, **options)


_SPLICES = [
    "&a ",
    "*a",
    "!!str ",
    "!!binary ",
    "!!python/object ",
    "<<: *a\n",
    "? ",
    "- ",
    ": ",
    "{",
    "[",
    "'",
]
_SPLICES += [
    '"',
    "#",
    "\t",
    "\n",
    "\r",
    "\x00",
    "\ufeff",
    "%YAML 1.1\n",
    "---\n",
    "...\n",
    "|\n",
    ">-\n",
    "\\",
]


@st.composite
def text_mutation(draw: st.DrawFn, text: str) -> str:
    """The text after 1-4 character or line edits."""
    lines = text.split("\n")
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        j = draw(st.integers(0, len(line)))
        op = draw(st.sampled_from(["splice", "char", "delete", "dup", "drop", "indent", "dedent"]))
        if op == "splice":
            lines[i] = line[:j] + draw(st.sampled_from(_SPLICES)) + line[j:]
        elif op == "char":
            lines[i] = line[:j] + draw(st.characters(exclude_categories=["Cs"])) + line[j:]
        elif op == "delete":
            lines[i] = line[:j] + line[j + 1 :]
        elif op == "dup":
            lines.insert(i, line)
        elif op == "drop" and len(lines) > 1:
            del lines[i]
        elif op == "indent":
            lines[i] = "  " + line
        elif op == "dedent":
            lines[i] = line[2:] if line.startswith("  ") else line.lstrip()
    return "\n".join(lines)


@st.composite
def deep_nesting(draw: st.DrawFn) -> str:
    """Collections nested hundreds to thousands deep, flow or block style."""
    depth = draw(st.integers(50, 1200))
    style = draw(st.sampled_from(["flow-list", "flow-map", "block-list", "block-map", "alias"]))
    if style == "flow-list":
        return "[" * depth + "]" * draw(st.sampled_from([0, depth]))
    if style == "flow-map":
        return "{a: " * depth + "1" + "}" * depth
    if style == "block-list":
        return "".join(" " * i + "-\n" for i in range(min(depth, 150)))
    if style == "block-map":
        return "".join(" " * i + "k:\n" for i in range(min(depth, 150)))
    return "a: &a [" + ", ".join(["*a"] * 3) + "]\n" + "b: &b [*a, *a]\n" * 3


def documents(kind: str) -> st.SearchStrategy[str]:
    """Inputs for one loader: the corpus, its tree and text mutations, random YAML and deep nesting."""
    texts = CORPUS[kind]
    base = st.sampled_from(texts)
    random_doc = VALUES.map(_dump)
    keyed = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4).map(_dump)
    return st.one_of(
        base,
        base.flatmap(tree_mutation),
        base.flatmap(tree_mutation),
        base.flatmap(tree_mutation),
        base.flatmap(text_mutation),
        random_doc,
        keyed,
        deep_nesting(),
    )


# --- the harnesses ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """A directory for the config, its included file and its rule file (rewritten by every example)."""
    with tempfile.TemporaryDirectory(prefix="fuzz-loaders-") as tmp:
        yield Path(tmp)


def _store_for(groups: Any) -> SampleStore:
    """One sample of every metric name the rules read, so that alerts fire and templates run."""
    store = SampleStore(retention=math.inf)
    needs = store_needs(groups, 300.0)
    for name in sorted(needs.names or {"up"}):
        store.append(make_labels(name, {"job": "fuzz", "instance": "i"}), round((T0 - 30) * 1000), 1.0)
    return store


def run_rules(groups: Any) -> None:
    """Build and evaluate what a rule file defines, twice, as the daemon would."""
    for group in groups:
        for rule in group.rules:
            assert history_needed(rule.expr) >= 0
    store = _store_for(groups)
    manager = RuleManager(
        groups, RuleManagerOptions(vector_query(Engine(store)), store, default_interval=1.0)
    )
    for t in (T0, T0 + 600):
        manager.evaluate_all(t)
        manager.alerts_to_send(t)
    manager.rules_json()
    manager.alerts_json()


@fuzz(2)
@given(documents("config"), st.none() | st.tuples(documents("include"), documents("rules")))
@example("[" * 2000, None)
@example("targets: " + "{a: " * 1500 + "1" + "}" * 1500, None)
def test_config_loader(scratch: Path, config: str, local: tuple[str, str] | None) -> None:
    included, rules = local or (CORPUS["include"][0], CORPUS["rules"][0])
    if local:  # reach the mutated included file and rule file instead of the bundled ones
        config = config.replace("bundled:watchdog.yml", "inc.yml").replace("bundled:vllm.rules.yml", "r.yml")
    source = scratch / "config.yml"
    texts = {str(source): config, str(scratch / "inc.yml"): included, str(scratch / "r.yml"): rules}
    for path, text in texts.items():
        Path(path).write_text(text, encoding="utf-8")
    readable = dict(texts)
    cfg = loads_cleanly(lambda: parse_config(config, str(source), env=ENV), readable)
    if cfg is not None:
        loads_cleanly(lambda: load_rule_files(cfg.rule_files), readable)  # type: ignore[attr-defined]


@fuzz(2)
@given(documents("rules"))
@example("groups: " + "[" * 2000)
def test_rule_file_loader(text: str) -> None:
    groups = loads_cleanly(lambda: parse_rule_file(text, "r.yml"), {"r.yml": text})
    if groups is not None:
        run_rules(groups)


@fuzz(1)
@given(documents("tests"))
@example("tests: " + "[" * 2000)
def test_rule_test_file_loader(text: str) -> None:
    path = str(RULETESTS / "fuzz.yml")  # rule_files resolve next to the real fixtures; nothing is written
    loads_cleanly(lambda: parse_test_file(text, path), {path: text})


def test_corpus_loads() -> None:
    """The unmutated inputs are valid, so mutations start from what the loaders accept."""
    for path in CONFIGS:
        parse_config(_text(path), str(path), env=ENV)
    for path in RULES:
        run_rules(parse_rule_file(_text(path), str(path)))
    for path in TESTFILES:
        if path.name.startswith("invalid_"):
            with pytest.raises(ConfigError):
                parse_test_file(_text(path), str(path))
        else:
            parse_test_file(_text(path), str(path))
    assert len(KEYS) > 80 and len(_SUBTREES) > 1000  # a vocabulary to mutate with


# --- regressions: what the fuzzer found ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[" * 2000,
        "targets: " + "{a: " * 1500 + "1" + "}" * 1500,
        "".join(" " * i + "-\n" for i in range(300)),
    ],
)
def test_deep_nesting_is_a_problem_not_a_recursion_error(text: str) -> None:
    """PyYAML composes recursively: nesting past Python's recursion limit raised RecursionError."""
    for load in (lambda: parse_config(text, "c.yml", env={}), lambda: parse_rule_file(text, "c.yml")):
        with pytest.raises(ConfigError, match=r"c\.yml:\d+: \(yaml\): nested deeper than 100 levels"):
            load()


def test_deep_nesting_names_the_line_where_it_gets_too_deep() -> None:
    text = "groups:\n" + "".join(" " * (i + 1) + "-\n" for i in range(150))
    with pytest.raises(ConfigError) as info:
        parse_rule_file(text, "r.yml")
    assert [(p.line, p.field) for p in info.value.problems] == [(101, "(yaml)")]


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("null\n", "(root)"),
        ("[1]\n", "(root)"),
        ("7\n", "(root)"),
        ("'': 1\n", '""'),
        ("global: {'': 1}\n", 'global.""'),
    ],
)
def test_every_problem_names_a_field(text: str, field: str) -> None:
    """A document that is not a mapping, and an empty key, gave problems with an empty field ("c.yml:1: : ...")."""
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yml", env={})
    assert [p.field for p in info.value.problems] == [field]


@pytest.mark.parametrize("url", ["http://127.0.0.1:&a 8000", "http://h:x", "http://h:99999", "http://h:0"])
def test_a_target_url_with_a_bad_port_is_a_problem(url: str) -> None:
    """urlsplit accepts any port text and .port raises later: the gateway's check let a ValueError escape."""
    text = f"targets:\n  - name: a\n    url: '{url}'\ngateway:\n  target: a\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, "c.yml", env={})
    assert (3, "targets[0].url") in [(p.line, p.field) for p in info.value.problems]
