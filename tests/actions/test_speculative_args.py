"""--speculative-config on a vLLM command line: read in every spelling, its schedule set, removed keys refused."""

from __future__ import annotations

import pytest

from vllm_watchdog.actions.runtimes.speculative import read_config, refuse_removed, with_schedule

BASE = ["-m", "vllm.entrypoints.openai.api_server", "--model", "/m"]


def test_the_json_value_and_its_dotted_sub_keys_make_one_config() -> None:
    args = [
        *BASE,
        "-sc",
        '{"method":"ngram","num_speculative_tokens":4}',
        "--speculative-config.prompt_lookup_max",
        "3",
    ]
    assert read_config(args) == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    assert read_config(BASE) is None
    with pytest.raises(ValueError, match="not a JSON object"):
        read_config([*BASE, "--speculative-config", "[1]"])


def test_the_schedule_replaces_the_config_in_one_value_where_it_was() -> None:
    args = [
        *BASE,
        "--speculative-config.method",
        "ngram",
        "--max-num-seqs",
        "8",
        "--speculative-config.num_speculative_tokens",
        "4",
    ]
    new, dropped = with_schedule(args, [(1, 4, 4), (5, 65536, 0)])
    assert dropped == []
    assert new == [
        *BASE,
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[1,4,4],[5,65536,0]]}',
        "--max-num-seqs",
        "8",
    ]
    with pytest.raises(ValueError, match="no speculation to schedule"):
        with_schedule(BASE, [(1, 4, 4)])


def test_a_removed_key_is_dropped_by_the_schedule_and_refused_elsewhere() -> None:
    args = [
        *BASE,
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":2,"disable_by_batch_size":null}',
    ]
    new, dropped = with_schedule(args, [(1, 65536, 2)])
    assert dropped == ["disable_by_batch_size"] and "disable_by_batch_size" not in " ".join(new)
    refuse_removed(new)
    with pytest.raises(ValueError, match="disable_by_batch_size: vLLM removed it"):
        refuse_removed(args)
