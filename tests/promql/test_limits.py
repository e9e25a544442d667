"""Hostile expressions are refused before promql-parser sees them (issue 28, finding 1), and what is let
through parses and evaluates within the stack, in time and memory proportional to its size.

The parser overflows its stack on a 4,500-operand chain and kills the process, so the hostile parses run in a
child process: a regression fails a test instead of taking pytest down with it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from vllm_watchdog.promql import compile as compile_module
from vllm_watchdog.promql import positions
from vllm_watchdog.promql.compile import compile_expr, compile_plan
from vllm_watchdog.promql.engine import Engine
from vllm_watchdog.promql.limits import MAX_DEPTH, MAX_LENGTH, MAX_TERMS, check_shape
from vllm_watchdog.promql.plancache import WeightedCache
from vllm_watchdog.promql.values import PromQLError, Scalar, Vector
from vllm_watchdog.store import SampleStore, make_labels

ROOT = Path(__file__).resolve().parents[2]

HOSTILE = {
    "chain": "+".join(["1"] * 4500),  # 9 KB: SIGSEGV in the parser
    "parens": "(" * 8000 + "1" + ")" * 8000,  # 16 KB: 3.8-5.5 s and 4.4 GB in the parser
    "calls": "abs(" * 3000 + "x" + ")" * 3000,
    "unary": "-(" * 3000 + "1" + ")" * 3000,
    "wide": " or ".join(['x{a="1"}'] * 1000),  # shallow, but 3,000 terms and 999 operators in one group
}

_CHILD = """
import json, sys
from vllm_watchdog.promql.compile import compile_plan
from vllm_watchdog.promql.values import PromQLError
out = {}
for name, text in json.load(sys.stdin).items():
    try:
        compile_plan(text)
        out[name] = "accepted"
    except PromQLError as exc:
        out[name] = [exc.message, exc.position]
print(json.dumps(out))
"""


def test_hostile_expressions_are_refused_before_the_parser() -> None:
    # Without the checks the child dies of SIGSEGV on the first one (and would take seconds and GBs after).
    child = subprocess.run(
        [sys.executable, "-c", _CHILD],
        input=json.dumps(HOSTILE),
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, (child.returncode, child.stderr[-2000:])
    answers = json.loads(child.stdout)
    for name in ("chain", "parens", "calls", "unary"):
        message, position = answers[name]
        assert message.startswith("expression nested too deeply"), (name, message)
        assert 0 <= position < len(HOSTILE[name])
    assert answers["wide"][0].startswith(f"expression nested too deeply: more than {MAX_DEPTH} levels")


def test_the_depth_error_points_at_the_operator_or_bracket_past_the_limit() -> None:
    chain = "1" + " + 1" * MAX_DEPTH
    with pytest.raises(PromQLError) as info:
        compile_plan(chain)
    assert chain[info.value.position or 0] == "+"
    assert info.value.position == len("1") + (MAX_DEPTH - 1) * len(" + 1") + 1
    nested = "(" * MAX_DEPTH + "1" + ")" * MAX_DEPTH
    with pytest.raises(PromQLError) as info:
        compile_plan(nested)
    assert info.value.position == MAX_DEPTH - 1  # the root is a level: bracket number 128 is one too many


def test_too_long_and_too_many_terms() -> None:
    with pytest.raises(PromQLError, match="expression too long: 16385 characters, the limit is 16384"):
        compile_plan("x" * (MAX_LENGTH + 1))
    wide = "sum by (" + ", ".join(f"l{i}" for i in range(MAX_TERMS)) + ") (x)"
    with pytest.raises(PromQLError, match=f"expression too large: .* the limit is {MAX_TERMS}"):
        compile_plan(wide)
    compile_plan('x{a="' + "y" * (MAX_LENGTH - 20) + '"}')  # a long string is one term


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        ('x{a="' + "(" * 500 + '"}', 2),
        ("x{a='" + "[" * 500 + "\\'" + "'}", 2),
        ("x{a=`" + "{" * 500 + "\\`", 2),
        ("x # " + "(" * 500 + "\n + 1", 2),
        ('x{a=~"' + "+" * 500 + '"}', 2),
        ('x{a!="1", b="2"} != 1e-5 and x offset -5m', 5),  # root: 1 + `!=`, `and`, `-`; braces: +1
    ],
)
def test_brackets_and_operators_inside_strings_and_comments_do_not_count(text: str, depth: int) -> None:
    assert check_shape(text).depth == depth


def test_every_rule_and_dashboard_expression_fits_with_room() -> None:
    import yaml

    texts: list[str] = []
    for path in [*(ROOT / "rules").glob("*.yml"), *(ROOT / "grafana" / "dashboards").glob("*.json")]:
        data = yaml.safe_load(path.read_text())
        stack: list[object] = [data]
        while stack:
            item = stack.pop()
            if isinstance(item, dict):
                texts += [v for k, v in item.items() if k in ("expr", "query") and isinstance(v, str)]
                stack += list(item.values())
            elif isinstance(item, list):
                stack += item
    assert len(texts) > 50
    shapes = [check_shape(text) for text in texts]
    assert max(s.depth for s in shapes) * 4 <= MAX_DEPTH
    assert max(s.terms for s in shapes) * 16 <= MAX_TERMS


def _at_depth(frames: int, work: Callable[[], object]) -> object:
    """Call work with `frames` more Python frames on the stack, as the API's handlers add."""
    return work() if frames == 0 else _at_depth(frames - 1, work)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1" + " + 1" * (MAX_DEPTH - 1), 128.0),
        ("(" * (MAX_DEPTH - 1) + "2" + ")" * (MAX_DEPTH - 1), 2.0),
        ("-(" * (MAX_DEPTH // 2 - 1) + "3" + ")" * (MAX_DEPTH // 2 - 1), -3.0),
        ("scalar(" + "abs(" * (MAX_DEPTH - 3) + "x" + ")" * (MAX_DEPTH - 3) + ")", 4.0),
        ("scalar(" + "sum(" * (MAX_DEPTH - 3) + "x" + ")" * (MAX_DEPTH - 3) + ")", 4.0),
        ("scalar(" + "x + " * (MAX_DEPTH - 2) + "x)", 4.0 * (MAX_DEPTH - 1)),
    ],
)
def test_the_deepest_accepted_expressions_compile_and_evaluate(text: str, expected: float) -> None:
    assert check_shape(text).depth <= MAX_DEPTH
    store = SampleStore(1e9)
    store.append(make_labels("x", {}), 0, 4.0)
    value = _at_depth(200, lambda: Engine(store).query(text, 1.0))
    assert isinstance(value, Scalar) and value.value == expected


def test_a_long_malformed_expression_is_located_in_few_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each token's prefix was parsed with a dozen completions: 2,000 tokens cost seconds of CPU per request.
    parses: list[str] = []
    real = positions.promql_parser.parse

    def counting(text: str) -> object:
        parses.append(text)
        return real(text)

    monkeypatch.setattr(positions.promql_parser, "parse", counting)
    text = " or ".join(['x{a="1",b="2",c="3"}'] * 120) + " or"
    with pytest.raises(PromQLError) as info:
        compile_expr(text)
    assert info.value.position == len(text)
    assert len(parses) < 300
    short = "sum(rate(x[5m]) by (a)"
    with pytest.raises(PromQLError) as info:
        compile_expr(short)
    assert info.value.position == short.index("by")


def test_a_bisected_position_is_the_linear_scans() -> None:
    for text in (
        " or ".join(["x"] * 40) + ") or " + " or ".join(["x"] * 40),
        "sum(" + " + ".join(["x"] * 60) + ") by (a",
        " + ".join(["rate(x[5m])"] * 30) + " + rate(x[5m)",
    ):
        tokens = positions.tokenize(text)
        assert len(tokens) > positions._LINEAR_SCAN
        linear = next(
            (t.start for k, t in enumerate(tokens) if not positions._viable(text, tokens[: k + 1])),
            len(text.rstrip()),
        )
        with pytest.raises(PromQLError) as info:
            compile_plan(text)
        assert info.value.position == linear


def test_the_plan_cache_is_bounded_by_the_terms_it_holds() -> None:
    plans = compile_module._PLANS
    for i in range(300):
        compile_plan(" + ".join([f"x{i}_{j}" for j in range(MAX_DEPTH - 2)]) + f" + vector({i})")
    assert plans.weight <= plans.max_weight
    assert len(plans) < 4096
    cache: WeightedCache[str, int] = WeightedCache(max_entries=3, max_weight=10)
    for key, weight in (("a", 4), ("b", 4), ("c", 4), ("d", 11)):
        cache.put(key, weight, weight)
    assert (cache.get("a"), cache.get("b"), cache.get("c"), cache.get("d")) == (None, 4, 4, None)
    assert cache.weight == 8


def test_a_vector_result_of_a_deep_chain_keeps_its_labels() -> None:
    store = SampleStore(1e9)
    store.append(make_labels("x", {"a": "1"}), 0, 1.0)
    value = Engine(store).query(" + ".join(["x"] * MAX_DEPTH), 1.0)
    assert isinstance(value, Vector) and [s.value for s in value] == [float(MAX_DEPTH)]
