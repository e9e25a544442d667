"""Reading and editing a vLLM command line (a list of str) the way vLLM's own parser reads it.

vLLM's parser (argparse plus its `FlexibleArgumentParser`) accepts, and so do these functions:

- `--flag value` and `--flag=value`; a value may start with a single `-` (`--seed -1`) or be JSON;
- bare boolean flags and their `--no-flag` negations (argparse's BooleanOptionalAction);
- `--max_num_seqs` for `--max-num-seqs` (underscores in the name, before any `.`, are dashes);
- short aliases such as `-tp 2` (`--tensor-parallel-size`) and `-sc` (`--speculative-config`);
- dotted JSON sub-keys: `--speculative-config.method ngram` sets one key of `--speculative-config`;
- flags taking several values (`--served-model-name a b`);
- a flag given twice: the last one wins.

Whether a flag takes a value: every vLLM flag does except the booleans in `BOOLEAN_FLAGS`, and a flag
followed by another flag (a token starting with `--`, or a known short alias) has none. A command that
hides its arguments in a shell string (`bash -c "..."`) cannot be edited: ValueError.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

_BOOLEANS = """
enforce-eager enable-prefix-caching enable-chunked-prefill trust-remote-code disable-log-stats
disable-log-requests enable-log-requests enable-prompt-tokens-details enable-auto-tool-choice
enable-lora enable-sleep-mode enable-expert-parallel enable-eplb enable-dbo async-scheduling
skip-tokenizer-init disable-sliding-window disable-cascade-attn disable-custom-all-reduce
disable-frontend-multiprocessing disable-async-output-proc disable-mm-preprocessor-cache
disable-hybrid-kv-cache-manager disable-chunked-mm-input disable-fastapi-docs disable-uvicorn-access-log
enable-server-load-tracking enable-request-id-headers enable-force-include-usage enable-log-outputs
enable-tokenizer-info-endpoint enable-prompt-embeds enable-ssl-refresh enable-offline-docs
enable-per-request-metrics return-tokens-as-token-ids allow-credentials log-error-stack
trust-request-chat-template exclude-tools-when-tool-choice-none ray-workers-use-nsight
fully-sharded-loras use-tqdm-on-load calculate-kv-scales kv-sharing-fast-prefill enable-mm-embeds
language-model-only skip-mm-profiling interleave-mm-strings enable-reasoning use-v2-block-manager
worker-use-ray multi-step-stream-outputs headless grpc aggregate-engine-logging tokens-only
data-parallel-hybrid-lb data-parallel-external-lb data-parallel-multi-port-external-lb
kv-cache-metrics cudagraph-metrics enable-mfu-metrics enable-cumem-allocator numa-bind
allow-deprecated-quantization cohere-is-reasoning-model dcp-q-replicate disable-nccl-for-dp-synchronization
enable-batch-sharded-sampling enable-elastic-ep enable-ep-weight-filter enable-fault-tolerance
enable-flash-late-interaction enable-flashinfer-autotune enable-hc-sp enable-layerwise-nvtx-tracing
enable-log-deltas enable-logging-iteration-details enable-mamba-cache-stochastic-rounding
enable-mamba-shared-prefix-checkpoint enable-mixed-moe-lora-format enable-moe-shared-loras
enable-nccl-comm-suspend enable-return-routed-experts enable-scale-out enable-shm-tensor-arena
enable-tower-connector-lora enable-trace-replay fail-on-environ-validation jit-monitor-verbose
long-prefill-token-threshold-adaptive mm-device-do-normalize mm-encoder-only return-sampling-mask
scheduler-reserve-full-isl sleep-mode-offload-cudagraph specialize-active-lora swa-bounded-replay
trust-request-mm-kwargs use-fp64-gumbel use-replayssm
"""
BOOLEAN_FLAGS: Final = frozenset(f"--{name}" for name in _BOOLEANS.split())
"""vLLM flags that never take a value (vLLM 0.32's full set plus a few older ones); `--no-X` negates X."""

_MULTI = """
served-model-name api-key lora-modules allowed-media-domains logits-processors ignore-patterns
cudagraph-capture-sizes collect-detailed-traces lora-target-modules cpu-offload-params
"""
MULTI_VALUE_FLAGS: Final = frozenset(f"--{name}" for name in _MULTI.split())
"""vLLM flags that take one or more values (argparse nargs="+"): they consume every value that follows."""

SHORT_ALIASES: Final = {
    "-tp": "--tensor-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dp": "--data-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dpn": "--data-parallel-rank",
    "-dpr": "--data-parallel-start-rank",
    "-dpl": "--data-parallel-size-local",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-dpb": "--data-parallel-backend",
    "-dph": "--data-parallel-hybrid-lb",
    "-dpe": "--data-parallel-external-lb",
    "-dpm": "--data-parallel-multi-port-external-lb",
    "-ep": "--enable-expert-parallel",
    "-asc": "--api-server-count",
    "-q": "--quantization",
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-sc": "--speculative-config",
    "-cc": "--compilation-config",
    "-ac": "--attention-config",
    "-dc": "--diffusion-config",
}
"""vLLM's single-dash aliases of long flags."""

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "ash", "busybox"})
_PYTHON = re.compile(r"python[0-9.]*")
_OPT_LEVEL = "--optimization-level"  # -O3, -O=3, -O 3


class Missing(enum.Enum):
    """The type of MISSING: the flag does not occur at all (None means "present, without a value").

    A one-member enum, so that `value is MISSING` / `is not MISSING` narrows the type for mypy."""

    MISSING = "MISSING"

    def __repr__(self) -> str:
        return "MISSING"

    def __bool__(self) -> bool:
        return False


MISSING: Final = Missing.MISSING


@dataclass(frozen=True)
class Flag:
    """A flag name taken apart: its canonical long form, whether negated (`--no-`) and any dotted sub-key."""

    key: str  # "--max-num-seqs"
    negated: bool = False
    sub: str = ""  # "method" in --speculative-config.method

    @property
    def boolean(self) -> bool:
        """Whether this flag never takes a value."""
        return self.negated or (not self.sub and self.key in BOOLEAN_FLAGS)

    @property
    def spelling(self) -> str:
        """How to write it: `--no-enable-prefix-caching`, `--speculative-config.method`."""
        name = f"--no-{self.key[2:]}" if self.negated else self.key
        return f"{name}.{self.sub}" if self.sub else name


@dataclass(frozen=True)
class Item:
    """One parsed argument: tokens[start:end] of the command line; `flag` is None for a positional."""

    start: int
    end: int
    flag: Flag | None
    values: tuple[str, ...] = ()
    inline: bool = False  # --flag=value

    @property
    def value(self) -> str | None:
        """The value as vLLM sees it (several values joined by spaces); None for a bare flag."""
        return " ".join(self.values) if self.values else None


def parse_flag(token: str) -> Flag | None:
    """The flag a token names (without any `=value`), or None if it is not a flag vLLM knows how to read."""
    name = token.split("=", 1)[0]
    if name.startswith("--") and len(name) > 2:
        base, dot, sub = name[2:].partition(".")
        base = base.replace("_", "-")
        if not dot and base.startswith("no-") and len(base) > 3:
            return Flag(f"--{base[3:]}", negated=True)
        return Flag(f"--{base}", sub=sub)
    if name.startswith("-O") and name != "-O":
        return Flag(_OPT_LEVEL)
    base, dot, sub = name.partition(".")
    if base in SHORT_ALIASES:
        return Flag(SHORT_ALIASES[base], sub=sub)
    return None


def canonical(flag: str) -> Flag:
    """The flag a caller names (`--max_num_seqs`, `-tp`, `--no-enforce-eager`); ValueError if not a flag."""
    parsed = parse_flag(flag)
    if parsed is None or "=" in flag:
        raise ValueError(f"not a vLLM flag: {flag!r}")
    return parsed


def _is_flag_token(token: str) -> bool:
    """Whether a token starts a new argument rather than being a value (argparse's view, for vLLM)."""
    return token.startswith("--") or parse_flag(token) is not None


def _hides_args(program: str, options: Sequence[str]) -> bool:
    """Whether `program options...` runs a command string (`sh -c`, `bash -lc`, `python -c`)."""
    base = os.path.basename(program)
    if base in _SHELLS:
        with_argument, final = "oO", ""
    elif _PYTHON.fullmatch(base):
        with_argument, final = "WXQ", "m"  # python -m ends python's own options
    else:
        return False
    skip = False
    for option in options:
        if skip:
            skip = False
            continue
        if option == "--" or option[:1] not in ("-", "+") or option.startswith("--"):
            return False
        for pos, letter in enumerate(option[1:], start=1):
            if letter == "c":
                return True
            if letter in final:
                return False
            if letter in with_argument:
                skip = pos == len(option) - 1  # its argument is the next token
                break
    return False


def check_editable(args: Sequence[str]) -> None:
    """ValueError if the arguments are inside a shell string (`bash -c "..."`) where they cannot be edited."""
    for index, token in enumerate(args):
        if token.startswith("--"):
            return  # vLLM's own flags have begun
        if _hides_args(token, args[index + 1 :]):
            raise ValueError("cannot edit arguments inside a shell command (`sh -c`): give the argv instead")


def parse(args: Sequence[str]) -> list[Item]:
    """Split a command line into items, as vLLM's parser would group its tokens."""
    check_editable(args)
    items: list[Item] = []
    i, n = 0, len(args)
    while i < n:
        token = args[i]
        if token == "--":  # argparse: everything after is positional
            items.extend(Item(j, j + 1, None) for j in range(i, n))
            break
        if token == "-O" and i + 1 < n and args[i + 1] in {"0", "1", "2", "3"}:
            items.append(Item(i, i + 2, Flag(_OPT_LEVEL), (args[i + 1],)))
            i += 2
            continue
        flag = parse_flag(token)
        if flag is None:
            items.append(Item(i, i + 1, None))
            i += 1
            continue
        if flag.key == _OPT_LEVEL and not token.startswith("--"):  # -O3, -O=3
            level = token[3:] if token[2:3] == "=" else token[2:]
            items.append(Item(i, i + 1, flag, (level,), inline=True))
            i += 1
            continue
        if "=" in token:
            items.append(Item(i, i + 1, flag, (token.split("=", 1)[1],), inline=True))
            i += 1
            continue
        if flag.sub:  # vLLM takes the next token as the sub-key's value, whatever it looks like
            end = min(i + 2, n)
            items.append(Item(i, end, flag, tuple(args[i + 1 : end])))
            i = end
            continue
        end = i + 1
        if not flag.boolean:
            limit = n if flag.key in MULTI_VALUE_FLAGS else i + 2
            while end < min(limit, n) and args[end] != "--" and not _is_flag_token(args[end]):
                end += 1
        items.append(Item(i, end, flag, tuple(args[i + 1 : end])))
        i = end
    return items


def get_arg(args: Sequence[str], flag: str) -> str | Missing | None:
    """The value vLLM would use for `flag`: its last occurrence's value, None for a bare flag, MISSING if
    absent. For a boolean, `--flag` and `--no-flag` are one setting: asking for the one that lost (or
    does not occur) gives MISSING. Dotted sub-keys are not whole values: `has_arg` sees them."""
    want = canonical(flag)
    found: str | Missing | None = MISSING
    for item in parse(args):
        if item.flag is None or item.flag.key != want.key or item.flag.sub != want.sub:
            continue
        found = item.value if item.flag.negated == want.negated else MISSING
    return found


def has_arg(args: Sequence[str], flag: str) -> bool:
    """Whether the command sets `flag` in any spelling: `--flag v`, `--flag=v`, `--no-flag`, `--flag.key v`,
    an alias; a dotted flag asks about that sub-key only."""
    want = canonical(flag)
    return any(_covers(want, item) for item in parse(args))


def _covers(want: Flag, item: Item) -> bool:
    """Whether `item` is (part of) the setting `want` names: all of it, or only its sub-key if it has one."""
    if item.flag is None or item.flag.key != want.key:
        return False
    return not want.sub or item.flag.sub == want.sub


def remove_args(args: Sequence[str], flags: Iterable[str]) -> list[str]:
    """The command without every occurrence of `flags` (with their values, negations, sub-keys, aliases);
    a dotted flag (`--speculative-config.method`) removes only that sub-key."""
    wants = [canonical(flag) for flag in flags]
    drop: set[int] = set()
    for item in parse(args):
        if any(_covers(want, item) for want in wants):
            drop.update(range(item.start, item.end))
    return [token for i, token in enumerate(args) if i not in drop]


def _render(flag: Flag, value: str | None, like: Item | None, args: Sequence[str]) -> list[str]:
    """Tokens for one flag, keeping the spelling and `=` style of the item it replaces where it can."""
    if flag.boolean and value is not None:
        raise ValueError(f"{flag.spelling} takes no value")
    name = flag.spelling
    inline = False
    if like is not None and like.flag == flag and args[like.start].startswith("--"):
        name = args[like.start].split("=", 1)[0]  # the user's spelling, e.g. --max_num_seqs
        inline = like.inline
    if value is None:
        return [name]
    if inline or value.startswith("-"):
        return [f"{name}={value}"]  # a separate token starting with - could read as a flag
    return [name, value]


def set_args(args: Sequence[str], values: Mapping[str, str | None]) -> list[str]:
    """The command with each flag set to its value (None: a bare boolean flag, or `--no-flag`).

    An existing setting is replaced where it first occurs and its other occurrences (either polarity,
    sub-keys, aliases) are removed; a new flag is appended (before a `--` separator, if any).
    """
    wanted: dict[str, tuple[Flag, str | None]] = {}
    for name, value in values.items():
        flag = canonical(name)
        if flag.sub:
            raise ValueError(f"{name}: set the whole value of {flag.key}, not one sub-key")
        if flag.key in wanted:
            raise ValueError(f"{name} is given twice")
        wanted[flag.key] = (flag, value)
    items = parse(args)
    out: list[str] = []
    done: set[str] = set()
    separator = next((item.start for item in items if args[item.start] == "--" and item.flag is None), None)
    for item in items:
        if separator is not None and item.start == separator:
            out.extend(_appended(wanted, done, args))
        key = item.flag.key if item.flag is not None else None
        if key is None or key not in wanted:
            out.extend(args[item.start : item.end])
            continue
        if key not in done:
            flag, value = wanted[key]
            out.extend(_render(flag, value, item, args))
            done.add(key)
    if separator is None:
        out.extend(_appended(wanted, done, args))
    return out


def _appended(
    wanted: Mapping[str, tuple[Flag, str | None]], done: set[str], args: Sequence[str]
) -> list[str]:
    out: list[str] = []
    for key, (flag, value) in wanted.items():
        if key not in done:
            out.extend(_render(flag, value, None, args))
            done.add(key)
    return out


def restore_args(current: Sequence[str], original: Sequence[str], flags: Iterable[str]) -> list[str]:
    """`current` with `flags` exactly as `original` had them: every spelling, negation, sub-key and alias
    `original` used, token for token, or absent where `original` lacked them (the undo of an edit)."""
    wants = [canonical(flag) for flag in flags]
    tokens = [
        token
        for item in parse(original)
        if any(_covers(want, item) for want in wants)
        for token in original[item.start : item.end]
    ]
    out = remove_args(current, [want.spelling for want in wants])
    separator = next((i.start for i in parse(out) if i.flag is None and out[i.start] == "--"), len(out))
    return [*out[:separator], *tokens, *out[separator:]]
