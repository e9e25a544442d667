"""Tests of vLLM command-line editing: examples of each syntax, then hypothesis properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_watchdog.actions.config import DRAFT_FLAGS
from vllm_watchdog.actions.runtimes.args import (
    BOOLEAN_FLAGS,
    MISSING,
    get_arg,
    has_arg,
    parse,
    remove_args,
    restore_args,
    set_args,
)

SERVE = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/tiny"]


# -- examples -------------------------------------------------------------------------------------


def test_value_forms_and_missing() -> None:
    args = [*SERVE, "--max-num-seqs", "4", "--port=8000", "--enforce-eager"]
    assert get_arg(args, "--max-num-seqs") == "4"
    assert get_arg(args, "--port") == "8000"
    assert get_arg(args, "--enforce-eager") is None
    assert get_arg(args, "--host") is MISSING
    assert not MISSING
    assert repr(MISSING) == "MISSING"


def test_dash_and_underscore_spellings_are_one_flag() -> None:
    args = [*SERVE, "--max_num_seqs", "4", "--gpu_memory_utilization=0.5"]
    assert get_arg(args, "--max-num-seqs") == "4"
    assert get_arg(args, "--max_num_seqs") == "4"
    assert get_arg(args, "--gpu-memory-utilization") == "0.5"
    # An edit keeps the user's spelling and `=` style.
    assert set_args(args, {"--max-num-seqs": "8", "--gpu-memory-utilization": "0.9"}) == [
        *SERVE,
        "--max_num_seqs",
        "8",
        "--gpu_memory_utilization=0.9",
    ]
    assert remove_args(args, ["--max-num-seqs"]) == [*SERVE, "--gpu_memory_utilization=0.5"]


def test_values_that_start_with_a_dash_and_json() -> None:
    spec = '{"method": "ngram", "num_speculative_tokens": 3}'
    args = [*SERVE, "--seed", "-1", "--speculative-config", spec, "--enforce-eager"]
    assert get_arg(args, "--seed") == "-1"
    assert get_arg(args, "--speculative-config") == spec
    # A new value starting with "-" is written inline, so that no parser can read it as a flag.
    assert set_args(args, {"--seed": "--x"})[5] == "--seed=--x"
    assert get_arg(set_args(args, {"--seed": "--x"}), "--seed") == "--x"
    assert set_args([*SERVE], {"--seed": "-5"}) == [*SERVE, "--seed=-5"]


def test_flag_followed_by_a_flag_has_no_value() -> None:
    args = [*SERVE, "--unknown-flag", "--port", "8000", "--other", "value"]
    assert get_arg(args, "--unknown-flag") is None
    assert get_arg(args, "--other") == "value"
    # A known short alias is a flag too, so it is not taken as a value.
    assert get_arg([*SERVE, "--quantization", "-tp", "2"], "--quantization") is None


def test_booleans_never_take_the_next_token() -> None:
    args = ["vllm", "serve", "--enforce-eager", "/models/tiny"]
    assert get_arg(args, "--enforce-eager") is None
    assert remove_args(args, ["--enforce-eager"]) == ["vllm", "serve", "/models/tiny"]
    assert {"--enforce-eager", "--enable-prefix-caching", "--trust-remote-code"} <= BOOLEAN_FLAGS


def test_negation_is_the_same_setting() -> None:
    args = [*SERVE, "--enable-prefix-caching", "--no-enable-prefix-caching"]
    assert get_arg(args, "--no-enable-prefix-caching") is None  # the last one wins
    assert get_arg(args, "--enable-prefix-caching") is MISSING
    assert has_arg(args, "--enable-prefix-caching")
    assert set_args(args, {"--enable-prefix-caching": None}) == [*SERVE, "--enable-prefix-caching"]
    assert set_args(args, {"--no-enable-prefix-caching": None}) == [*SERVE, "--no-enable-prefix-caching"]
    assert remove_args(args, ["--enable-prefix-caching"]) == SERVE
    with pytest.raises(ValueError, match="takes no value"):
        set_args(args, {"--enforce-eager": "true"})


def test_flag_given_twice_last_wins_and_edits_collapse() -> None:
    args = [*SERVE, "--max-num-seqs", "4", "--port", "1", "--max-num-seqs=8"]
    assert get_arg(args, "--max-num-seqs") == "8"
    assert set_args(args, {"--max-num-seqs": "2"}) == [*SERVE, "--max-num-seqs", "2", "--port", "1"]
    assert remove_args(args, ["--max-num-seqs"]) == [*SERVE, "--port", "1"]


def test_draft_flags_in_every_spelling_are_removed() -> None:
    args = [
        *SERVE,
        "-sc",
        '{"method": "ngram"}',
        "--speculative_config.num_speculative_tokens",
        "3",
        "--speculative-model=/models/draft",
        "--num-speculative-tokens",
        "5",
        "--max-num-seqs",
        "4",
    ]
    assert has_arg(args, "--speculative-config")
    assert remove_args(args, DRAFT_FLAGS) == [*SERVE, "--max-num-seqs", "4"]
    assert not any(has_arg(remove_args(args, DRAFT_FLAGS), flag) for flag in DRAFT_FLAGS)


def test_dotted_sub_keys() -> None:
    args = [*SERVE, "--compilation-config.mode", "3", "--compilation-config.level=2"]
    assert get_arg(args, "--compilation-config") is MISSING  # no whole value given
    assert get_arg(args, "--compilation-config.mode") == "3"
    assert has_arg(args, "--compilation-config")
    assert remove_args(args, ["--compilation-config.level"]) == [*SERVE, "--compilation-config.mode", "3"]
    assert set_args(args, {"--compilation-config": "{}"}) == [*SERVE, "--compilation-config", "{}"]
    with pytest.raises(ValueError, match="whole value"):
        set_args(args, {"--compilation-config.mode": "1"})


def test_short_aliases_and_optimization_level() -> None:
    args = ["vllm", "serve", "/m", "-tp", "2", "-O3", "-ep"]
    assert get_arg(args, "--tensor-parallel-size") == "2"
    assert get_arg(args, "-tp") == "2"
    assert get_arg(args, "--optimization-level") == "3"
    assert get_arg(args, "--enable-expert-parallel") is None
    assert set_args(args, {"--tensor-parallel-size": "4"}) == [
        "vllm",
        "serve",
        "/m",
        "--tensor-parallel-size",
        "4",
        "-O3",
        "-ep",
    ]
    assert get_arg(["vllm", "serve", "/m", "-O", "2"], "--optimization-level") == "2"


def test_multi_value_flags_take_every_value() -> None:
    args = [*SERVE, "--served-model-name", "a", "b", "--port", "8000"]
    assert get_arg(args, "--served-model-name") == "a b"
    assert remove_args(args, ["--served-model-name"]) == [*SERVE, "--port", "8000"]
    assert set_args(args, {"--served-model-name": "c"}) == [
        *SERVE,
        "--served-model-name",
        "c",
        "--port",
        "8000",
    ]


def test_new_flags_go_before_a_separator() -> None:
    args = ["launcher", "--port", "8000", "--", "--not-ours", "x"]
    assert set_args(args, {"--max-num-seqs": "2"}) == [
        "launcher",
        "--port",
        "8000",
        "--max-num-seqs",
        "2",
        "--",
        "--not-ours",
        "x",
    ]
    assert get_arg(args, "--not-ours") is MISSING
    assert remove_args(args, ["--not-ours"]) == args


def test_script_launchers_are_editable() -> None:
    args = ["bash", "scripts/serve-vllm.sh", "--port", "8000", "--max-num-seqs", "1"]
    assert set_args(args, {"--max-num-seqs": "4"})[-1] == "4"
    assert (
        get_arg(["python", "-Wignore", "-m", "vllm.entrypoints.cli.main", "serve", "--seed", "1"], "--seed")
        == "1"
    )


@pytest.mark.parametrize(
    "command",
    [
        ["bash", "-c", "vllm serve /m --max-num-seqs 4"],
        ["/bin/sh", "-ec", "exec vllm serve /m"],
        ["env", "A=1", "bash", "-lc", "vllm serve /m"],
        ["bash", "-o", "pipefail", "-c", "vllm serve /m"],
        ["python3", "-u", "-c", "import runpy"],
    ],
)
def test_shell_strings_are_refused(command: list[str]) -> None:
    for call in (
        lambda: get_arg(command, "--max-num-seqs"),
        lambda: remove_args(command, ["--max-num-seqs"]),
        lambda: set_args(command, {"--max-num-seqs": "2"}),
    ):
        with pytest.raises(ValueError, match="inside a shell command"):
            call()


def test_not_a_flag_is_rejected() -> None:
    with pytest.raises(ValueError, match="not a vLLM flag"):
        get_arg(SERVE, "max-num-seqs")
    with pytest.raises(ValueError, match="not a vLLM flag"):
        set_args(SERVE, {"--port=1": "2"})
    with pytest.raises(ValueError, match="given twice"):
        set_args(SERVE, {"--max-num-seqs": "1", "--max_num_seqs": "2"})


# -- properties -----------------------------------------------------------------------------------

VALUE_FLAGS = ["--max-num-seqs", "--seed", "--port", "--speculative-config", "--max-model-len", "--x-custom"]
BOOLS = ["--enforce-eager", "--enable-prefix-caching", "--trust-remote-code", "--disable-log-stats"]
FLAGS = VALUE_FLAGS + BOOLS + ["--served-model-name"]
words = st.text(alphabet="abcxyz0123456789./:{}\"' ,", min_size=1, max_size=8)
values = st.one_of(words, st.integers(-5, 5).map(str), st.just('{"method": "ngram"}'), st.just(""))


def _spell(flag: str, underscore: bool) -> str:
    return "--" + flag[2:].replace("-", "_") if underscore else flag


@st.composite
def items(draw: st.DrawFn) -> list[str]:
    """One argument, in one of the spellings vLLM accepts."""
    kind = draw(st.sampled_from(["value", "bool", "multi"]))
    underscore = draw(st.booleans())
    if kind == "bool":
        flag = draw(st.sampled_from(BOOLS))
        if draw(st.booleans()):
            flag = "--no-" + flag[2:]
        return [_spell(flag, underscore)]
    if kind == "multi":
        return [_spell("--served-model-name", underscore), *draw(st.lists(words, min_size=1, max_size=3))]
    flag = _spell(draw(st.sampled_from(VALUE_FLAGS)), underscore)
    value = draw(values)
    if value.startswith("-") or draw(st.booleans()):
        return [f"{flag}={value}"]
    return [flag, value]


commands = st.lists(items(), max_size=8).map(lambda parts: [*SERVE, *(t for p in parts for t in p)])
new_values = st.one_of(words, st.integers(-5, 5).map(str), st.just("--looks-like-a-flag"))


def _value_for(flag: str, value: str) -> str | None:
    return None if flag in BOOLS else value


def _others(args: list[str], flag: str) -> list[list[str]]:
    """Every item that is not the setting `flag`, as tokens, in order."""
    key = "--" + flag.removeprefix("--no-").removeprefix("--")
    return [
        args[i.start : i.end] for i in parse(args) if i.flag is None or i.flag.key != key.replace("_", "-")
    ]


@settings(max_examples=300, deadline=None)
@given(commands)
def test_items_cover_every_token_in_order(args: list[str]) -> None:
    parsed = parse(args)
    assert [i.start for i in parsed] == [0, *(i.end for i in parsed[:-1])]
    assert parsed[-1].end == len(args)


@settings(max_examples=300, deadline=None)
@given(commands, st.sampled_from(FLAGS), new_values)
def test_set_then_get(args: list[str], flag: str, value: str) -> None:
    edited = set_args(args, {flag: _value_for(flag, value)})
    assert get_arg(edited, flag) == _value_for(flag, value)
    assert get_arg(edited, _spell(flag, True)) == _value_for(flag, value)
    assert set_args(edited, {flag: _value_for(flag, value)}) == edited  # idempotent


@settings(max_examples=300, deadline=None)
@given(commands, st.sampled_from(FLAGS), new_values)
def test_remove_after_set_is_remove(args: list[str], flag: str, value: str) -> None:
    edited = set_args(args, {flag: _value_for(flag, value)})
    assert remove_args(edited, [flag]) == remove_args(args, [flag])
    assert not has_arg(remove_args(edited, [flag]), flag)
    if not has_arg(args, flag):
        assert remove_args(edited, [flag]) == args


@settings(max_examples=300, deadline=None)
@given(commands, st.sampled_from(FLAGS), new_values)
def test_unrelated_arguments_are_untouched(args: list[str], flag: str, value: str) -> None:
    before = _others(args, flag)
    assert _others(set_args(args, {flag: _value_for(flag, value)}), flag) == before
    assert _others(remove_args(args, [flag]), flag) == before
    for other in FLAGS:
        if other.removeprefix("--") != flag.removeprefix("--"):
            assert get_arg(remove_args(args, [flag]), other) == get_arg(args, other)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(VALUE_FLAGS), values, st.booleans()), max_size=8))
def test_last_occurrence_wins(pairs: list[tuple[str, str, bool]]) -> None:
    args = list(SERVE)
    expected: dict[str, str] = {}
    for flag, value, inline in pairs:
        args += [f"{flag}={value}"] if inline or value.startswith("-") else [flag, value]
        expected[flag] = value
    for flag in VALUE_FLAGS:
        assert get_arg(args, flag) == expected.get(flag, MISSING)


def test_restore_puts_back_every_spelling_exactly() -> None:
    original = [
        *SERVE,
        "--speculative-config.method",
        "ngram",
        "-sc.num_speculative_tokens=3",
        "--no-enable-prefix-caching",
    ]
    edited = set_args(remove_args(original, DRAFT_FLAGS), {"--enable-prefix-caching": None, "--port": "1"})
    touched = (*DRAFT_FLAGS, "--enable-prefix-caching")
    restored = restore_args(edited, original, touched)
    assert restored == [
        *SERVE,
        "--port",
        "1",
        "--speculative-config.method",
        "ngram",
        "-sc.num_speculative_tokens=3",
        "--no-enable-prefix-caching",
    ]
    assert restore_args([*SERVE, "--enforce-eager", "--", "x"], SERVE, ["--enforce-eager"]) == [
        *SERVE,
        "--",
        "x",
    ]
    assert restore_args(SERVE, [*SERVE, "--seed=-1"], ["--seed"]) == [*SERVE, "--seed=-1"]


@settings(max_examples=300, deadline=None)
@given(commands, commands, st.lists(st.sampled_from(FLAGS), max_size=3))
def test_restore_undoes_any_edit(original: list[str], current: list[str], flags: list[str]) -> None:
    restored = restore_args(current, original, flags)
    for flag in flags:
        assert get_arg(restored, flag) == get_arg(original, flag)
        if flag in BOOLS:
            assert get_arg(restored, "--no-" + flag[2:]) == get_arg(original, "--no-" + flag[2:])
    for other in FLAGS:
        if other not in flags:
            assert get_arg(restored, other) == get_arg(current, other)
