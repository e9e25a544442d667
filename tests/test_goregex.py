"""Go's regexp semantics on RE2: syntax Go accepts and refuses, anchoring, Expand and ReplaceAllString,
linear time on the patterns that stall a backtracking engine, limits; syntax checked against promtool."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.promtool import PROMTOOL, promtool_eval
from vllm_watchdog import goregex
from vllm_watchdog.goregex import MAX_PATTERN_BYTES, RegexError, compile_anchored, compile_go
from vllm_watchdog.promql.labelfuncs import label_replace

LONG = "a" * 100_000
NEEDS_PROMTOOL = pytest.mark.skipif(
    shutil.which(PROMTOOL) is None, reason="promtool (Debian: prometheus) missing"
)


@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        (r"\d+", "123", True),
        (r"\d+", "١٢٣", False),  # Go's \d is ASCII only
        (r"\w+", "héllo", False),
        (r"\pL+", "héllo", True),
        (r"\p{Greek}+", "Αλφα", True),
        (r"\p{Greek}+", "Alpha", False),
        (r"\P{Greek}+", "Alpha", True),
        (r"\p{^Greek}+", "Alpha", True),
        (r"\pN+", "٣4", True),
        (r"[[:alpha:]]+", "abcXYZ", True),
        (r"[[:digit:]x]+", "12x", True),
        (r"[[:^alpha:]]+", "12", True),
        (r"[[:word:]]+", "a_1", True),
        ("foo$", "foo\n", False),  # $ is the end of the text, not before a final newline
        ("a(?i)b|c", "C", True),  # the flag reaches across the alternation
        ("a(?i)b|c", "aB", True),
        ("a(?i)b|c", "AB", False),
        ("(?i)straße", "STRAßE", True),
        ("(?i)k", "\u212a", True),  # Kelvin sign folds to k, as in Go
        (r"\Qa.b\E", "a.b", True),
        (r"\Qa.b\E", "axb", False),
        (r"\x41\x{42}\101", "ABA", True),
        ("a{,2}", "a{,2}", True),  # Go reads {, literally
        (".", "\n", False),
        ("(?s).", "\n", True),
        (r"\bfoo\b", "foo", True),
        (r"a\z", "a", True),
        (r"\Aa", "a", True),
        ("(?U)(a+)(a*)", "aaa", True),
        ("(?m)^b$", "a\nb", False),  # the flag stays inside the anchors' group: the whole text must match
        ("(?m:a$\n^b)", "a\nb", True),
    ],
)
def test_anchored_matching_follows_go(pattern: str, text: str, matches: bool) -> None:
    assert compile_anchored(pattern).match_string(text) is matches


@pytest.mark.parametrize(
    "pattern",
    [
        *(r"\p{Greek}", r"\pN", r"\p{^Greek}", "(?U)a*", "(?i)a", "(?s).", "(?m)^a$", r"\z", r"\Qa.b\E", ""),
        *(r"(?P<name>a)", r"(?<name>a)", r"[[:^space:]]", r"\123", r"\x{10FFFF}", "(?i-s:a)", "x{2,1000}"),
    ],
)
def test_syntax_go_accepts(pattern: str) -> None:
    compile_go(pattern)
    compile_anchored(pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        r"(a)\1",  # backreference
        "(?P=n)",
        "(?=a)a",  # lookahead
        "(?!a)b",
        "(?<=x)a",  # lookbehind
        "(?<!x)a",
        "(?>a)",  # atomic group
        "a++",  # possessive
        "a*+",
        "a**",
        r"\Z",
        "(?#comment)",
        "(?x)a b",
        "(?a)a",
        r"\u0041",
        r"\N{DIGIT ONE}",
        "(?(1)a|b)",
        r"\C",  # RE2 alone would accept these two; Go refuses them
        "(?P<é>a)",
        "a{1001}",
        "[a",
        "a)",
        r"\p{Klingon}",
        "\ud800",  # not valid Unicode
    ],
)
def test_syntax_go_refuses(pattern: str) -> None:
    with pytest.raises(RegexError, match=r"^error parsing regexp: "):
        compile_go(pattern)


def test_anchoring_is_prometheus_text_concatenation() -> None:
    assert not compile_anchored("a|b").match_string("ab")
    assert not compile_anchored("foo").match_string("foobar")
    assert compile_go("foo").match_string("foobar")
    # "^(?:" + "a)|(b" + ")$" is a valid regex: Alertmanager and label_replace() accept it, as Go does
    assert compile_anchored("a)|(b").match_string("a")
    with pytest.raises(RegexError):
        compile_go("a)|(b")  # a bare parse refuses it (Prometheus selectors do both)
    with pytest.raises(RegexError, match="missing"):
        compile_anchored(r"\Qab")  # the \Q swallows the closing ")$" as in Go


@pytest.mark.parametrize(
    ("pattern", "text"),
    [
        ("(.+)+Q", LONG),
        ("(.*.*)*Q", LONG),
        ("(a|a)*b", LONG),
        ("(a+)+$", LONG + "!"),
        ("(x+x+)+y", "x" * 100_000),
        (r"^(\w+\s?)*$", LONG + "!"),
        ("((a*)*)*b", LONG),
    ],
)
def test_catastrophic_patterns_answer_in_linear_time(pattern: str, text: str) -> None:
    # A backtracking engine would not return from any of these: the test would hang, not fail.
    assert not compile_anchored(pattern).match_string(text)
    assert not compile_go(pattern).match_string(text)
    assert compile_go(pattern).replace_all_string(text, "x") == text


def test_catastrophic_pattern_that_matches_gives_its_groups() -> None:
    rx = compile_anchored("(a|aa)*(a*)")
    m = rx.find_string_submatch(LONG)
    assert m is not None and m.group(0) == LONG
    assert rx.expand_string("$2", m) == ""
    assert compile_go("(a|a)*").replace_all_string(LONG + "b", "<$0>") == f"<{LONG}>b<>"


def test_expand_follows_go() -> None:
    rx = compile_anchored(r"(.*)-(?P<n>\d+)")
    m = rx.find_string_submatch("abc-42")
    assert m is not None

    def ex(t: str) -> str:
        return rx.expand_string(t, m)

    assert ex("$1x") == ""  # the group named "1x", which does not exist
    assert ex("${1}x") == "abcx"
    assert ex("$n.$2") == "42.42"
    assert ex("${n}") == "42"
    assert ex("$$1") == "$1"
    assert ex("$") == "$" and ex("${") == "${" and ex("${1") == "${1" and ex("$-") == "$-"
    assert ex("$9") == "" and ex("$01") == "" and ex("$é") == ""
    assert ex("$0") == "abc-42"
    assert ex("$1000000000") == ""  # too many digits for a number, and no such name


def test_expand_with_duplicate_names_takes_the_first_that_matched() -> None:
    rx = compile_go("(?P<x>a)?(?P<x>b)")
    m = rx.find_string_submatch("b")
    assert m is not None and rx.expand_string("[$x]", m) == "[b]"


@pytest.mark.parametrize(
    ("pattern", "text", "template", "want"),
    [
        # the examples in Go's regexp documentation for ReplaceAllString
        ("a(x*)b", "-ab-axxb-", "T", "-T-T-"),
        ("a(x*)b", "-ab-axxb-", "$1", "--xx-"),
        ("a(x*)b", "-ab-axxb-", "$1W", "---"),
        ("a(x*)b", "-ab-axxb-", "${1}W", "-W-xxW-"),
        ("x*", "abxd", "-", "-a-b-d-"),  # no second replacement for the empty match after "x"
        ("", "éa", "-", "-é-a-"),  # empty matches step a whole character
        (r"\B", "aéa", "-", "aéa"),  # RE2 sees a \B inside é; Go (and we) never look there
        (r"\B", "éé", "-", "-é-é-"),
        ("$", "a\n", "<", "a\n<"),
        ("(?m)$", "a\nb", "<", "a<\nb<"),
        ("^", "a\nb", ">", ">a\nb"),
        ("é", "café", "e", "cafe"),
        ("(a)(b)?", "a ab", "[$2|$1]", "[|a] [b|a]"),
    ],
)
def test_replace_all_follows_go(pattern: str, text: str, template: str, want: str) -> None:
    assert compile_go(pattern).replace_all_string(text, template) == want


def test_match_string_never_reports_a_match_inside_a_character() -> None:
    assert not compile_go(r"\B").match_string("aéa")
    assert compile_go(r"\B").match_string("aé")
    assert compile_go(r"\B\Qab").replace_all_string("xabab", "-") == "x--"  # \Q open to the end
    # Skipping RE2's matches inside characters one search at a time would be quadratic here: every
    # search would scan to the end for the first alternative, then stop inside the next "é".
    text = "aé" * 50_000
    assert compile_go(r"a[^z]*z|\B").match_string(text)  # \B holds at the end of the text
    assert compile_go(r"a[^z]*z|\B").replace_all_string(text, "-") == text + "-"


def test_text_that_is_not_unicode_reads_as_replacement_characters() -> None:
    assert compile_anchored(".").match_string("\ud800")
    assert compile_anchored("\ufffd").match_string("\udcff")
    assert compile_go("b").replace_all_string("a\ud800b", "c") == "a\ufffdc"


def test_limits_refuse_huge_patterns_quickly() -> None:
    with pytest.raises(RegexError, match="longer than"):
        compile_go("a" * (MAX_PATTERN_BYTES + 1))
    with pytest.raises(RegexError, match="too large"):
        compile_go(r"\pL{1000}")  # Go accepts it; RE2 would need more than its memory budget
    compile_go("a" * (MAX_PATTERN_BYTES - 10))


def test_cache_is_bounded() -> None:
    for i in range(goregex.CACHE_ENTRIES + 50):
        compile_go(f"cache-test-{i}")
    assert len(goregex._CACHE._entries) <= goregex.CACHE_ENTRIES
    assert compile_go("cache-test-0").match_string("xcache-test-0x")


# Patterns whose acceptance promtool 2.42 (Go 1.19.8) decides; the documented differences are left out:
# (?<name>), Unicode scripts newer than Go 1.19, nesting deeper than 1000, programs over RE2's budget.
SYNTAX_CORPUS = [
    *(r"\C", r"\C+", r"[\C]", r"\Z", r"\z", r"\A", r"\b", r"\B", r"\Q.\E", r"\Qa\\Eb", r"\Q\E*"),
    *(r"\Qab", r"\Q\\", "(?P<n>a)", "(?P<é>a)", "(?P<n1_>a)", "(?P<1>a)", "(?P<>a)", "(?P<a-b>a)"),
    *("(?P<n>a)(?P<n>b)", "(?P=n)", "(?P>n)", "(?=a)", "(?!a)", "(?<=a)", "(?<!a)", "(?>a)", "(?#c)"),
    *("(?i)a", "(?U)a+", "(?s).", "(?m)^$", "(?imsU)x", "(?i-s:x)", "(?-)", "(?)", "(?i-)", "(?--i)"),
    *("(?x)a", "(?a)a", "(?u)a", "(?L)a", "a++", "a*+", "a?+", "a{2}+", "a**", "a*?", "a{2}{3}"),
    *("a{1000}", "a{1001}", "a{2,1}", "a{,2}", "a{", "(a{1000}){1000}", "x{0}", "a|*", "*a", "()", "(|)"),
    *("^*", "$+", r"\b*", "[]a]", "[^]a]", "[]", "[a-]", "[-a]", "[z-a]", "[a-\\d]", "[\\d-z]", "[[:foo:]]"),
    *("[[:alpha:]-z]", "[[:^word:]]", "[[=a=]]", "[a", "a)", "(a", r"\1", r"\8", r"\0", r"\12", r"\400"),
    *(r"\x", r"\x1", r"\x41", r"\x{}", r"\x{41}", r"\x{110000}", r"\xg0", r"\u0041", r"\e", r"\cA", r"\G"),
    *(r"\X", r"\R", r"\h", r"\K", r"\N{X}", r"\o{1}", r"\_", r"\-", r"\ ", r"\pL", r"\pX", r"\p{L}"),
    *(r"\p{Lu}", r"\p{L&}", r"\p{LC}", r"\p{Cn}", r"\p{Cs}", r"\p{Greek}", r"\p{greek}", r"\p{IsGreek}"),
    *(r"\p{^Greek}", r"\P{^Greek}", r"\p{Any}", r"\p{Braille}", r"\p{Han}", r"\pZ", r"[\p{Greek}\d]"),
    *("(?i)Σ", "a)|(b", "\x00", "é+", "\\", "a\\", "(?P<n>", "(?i:", "\\ufffd", "\\Q"),
]


def _promtool_accepts(patterns: list[str], tmp: Path) -> list[bool]:
    """Which patterns promtool's selector parser accepts as a regex: one `check rules` run for all."""
    escape = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\x00": "\\x00"})
    rules = [{"record": f"r{i}", "expr": f'up{{a=~"{p.translate(escape)}"}}'} for i, p in enumerate(patterns)]
    path = tmp / "regexes.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": rules}]}))
    out = subprocess.run([PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    refused = set()
    for line in (out.stdout + out.stderr).splitlines():
        if '"r' in line and "could not parse expression" in line:
            assert "error parsing regexp" in line, line  # any other parse error would void the comparison
            refused.add(int(line.split(', "r', 1)[1].split('"', 1)[0]))
    return [i not in refused for i in range(len(patterns))]


def _we_accept(pattern: str) -> bool:
    try:
        compile_go(pattern)  # what a Prometheus selector compiles: the bare pattern and the anchored one
        compile_anchored(pattern)
    except RegexError:
        return False
    return True


@NEEDS_PROMTOOL
def test_syntax_agrees_with_promtool(tmp_path: Path) -> None:
    theirs = _promtool_accepts(SYNTAX_CORPUS, tmp_path)
    differ = [(p, go) for p, go in zip(SYNTAX_CORPUS, theirs, strict=True) if _we_accept(p) is not go]
    assert differ == []
    assert sum(theirs) > 40 and len(theirs) - sum(theirs) > 40  # both sides of the line are exercised


_TOKENS = ["a", "b", ".", "*", "+", "?", "{2}", "(", ")", "(?:", "(?i)", "(?U)", "[ab]", r"\d", r"\pL"]
_TOKENS += [
    r"\p{Greek}",
    "|",
    "$",
    "^",
    r"\b",
    r"\B",
    "é",
    "\u03b1",
    "(?s:.)",
    "(?m)",
    r"\w",
    r"\s",
    "*?",
    "+?",
]
_VALUES = ["", "a", "ab", "aab", "ba", "abc1", "A", "αβ", "éa", "a b", "a\nb", "aaaa", "b", "AB12", "é"]


def _random_patterns(count: int, seed: int) -> list[str]:
    rnd = random.Random(seed)
    out: list[str] = []
    while len(out) < count:
        pattern = "".join(rnd.choice(_TOKENS) for _ in range(rnd.randint(1, 6)))
        if _we_accept(pattern):
            out.append(pattern)
    return out


@NEEDS_PROMTOOL
def test_random_patterns_match_and_expand_as_in_promtool() -> None:
    """label_replace() over varied values: anchoring, flags, classes, groups and $-expansion in one go."""
    patterns = _random_patterns(300, seed=13)
    escape = str.maketrans({"\\": "\\\\", "\n": "\\n"})
    series = {f'word{{w="{v.translate(escape)}", i="{i}"}}': "1" for i, v in enumerate(_VALUES)}
    template = "[$0|$1|${2}x]"
    cases = [
        (f'label_replace(word, "m", "{template}", "w", "{p.translate(escape)}")', "0s") for p in patterns
    ]
    differ = []
    for pattern, result in zip(patterns, promtool_eval(series, "1m", cases), strict=True):
        want = {dict(labels)["i"]: dict(labels).get("m") for labels, _ in result.samples}
        got = {}
        for i, value in enumerate(_VALUES):
            labels = tuple(sorted({"i": str(i), "w": value}.items() if value else {"i": str(i)}.items()))
            got[str(i)] = dict(label_replace(labels, "m", template, "w", pattern)).get("m")
        if result.error is not None or got != want:
            differ.append((pattern, result.error, got, want))
    assert differ == []
