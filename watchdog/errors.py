"""The exception hierarchy, documented in one place.

WatchdogError
├── ConfigError          config or rule files are invalid; carries every problem as file:line: field: message
├── ScrapeError          one scrape of one target failed (transport, status, size, parse, limits)
│   └── SampleLimitError the target exposed more series than its sample_limit
├── SourceError          a non-scrape source (NVML, health probe) failed
├── PromQLError          an expression cannot be parsed or uses an unsupported construct (has a position);
│                        raised at load time (promql/compile.py), so rule files fail `check`, not at 3 a.m.
├── QueryError           evaluating a valid expression failed (many-to-many matching, duplicate label
│   │                    sets, a remote backend down); the rule is marked unhealthy and its state kept
│   └── QueryTimeout     an API query ran past its deadline and was abandoned (503 "timeout")
└── ActionError          an action could not be carried out (Docker API error, process would not start,
    │                    systemctl failed, not ready in time); recorded as a failed action, rails back off
    └── RefusedError     the action would touch something the config does not name (another container,
                         an unknown unit); refused and logged, nothing touched

PromQLError, QueryError and QueryTimeout live in vllm_watchdog.promql.values next to the values they describe.
EtcdError (a WatchdogError, in vllm_watchdog.fleet.etcd) says etcd refused a request or no endpoint answered;
the fleet turns it into a refusal on the `fleet` rail, never into a failed action.
TemplateError (a ValueError, in vllm_watchdog.templates) is turned into a ConfigError at load time.
UnreadableFileError (a ValueError, in vllm_watchdog.config.files) says why a config, include, rule or
rule-test file was refused (not a regular file, too large, not UTF-8); the loaders turn it into a ConfigError.
ExpositionError (a ValueError, in vllm_watchdog.sources.exposition) is raised by the text parser and turned
into a ScrapeError by the scraper, so callers of sources only ever see ScrapeError.
"""

from __future__ import annotations

from dataclasses import dataclass


class WatchdogError(Exception):
    """Base class of every error this package raises on purpose."""


@dataclass(frozen=True)
class Problem:
    """One validation problem, located in a file."""

    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.field}: {self.message}"


class ConfigError(WatchdogError):
    """Config or rule files are invalid; `problems` lists every one found."""

    def __init__(self, problems: list[Problem], rule_files: tuple[str, ...] = ()) -> None:
        self.problems = sorted(problems, key=lambda p: (p.file, p.line))
        self.rule_files = rule_files  # resolved even when the config is invalid, so they can be checked too
        super().__init__("\n".join(str(p) for p in self.problems))


class ScrapeError(WatchdogError):
    """One scrape of one target failed; `kind` is a short label for metrics (timeout, status, ...)."""

    def __init__(self, message: str, kind: str = "connection") -> None:
        super().__init__(message)
        self.kind = kind


# Every ScrapeError.kind: vllm_watchdog_scrape_errors_total has a series per source for each, from 0.
SCRAPE_ERROR_KINDS = (
    "connection",
    "timeout",
    "status",
    "size",
    "encoding",
    "parse",
    "sample_limit",
    "label_limits",
    "series_limit",
)


class SampleLimitError(ScrapeError):
    """A target exposed more series than its sample_limit allows."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="sample_limit")


class SourceError(WatchdogError):
    """A non-scrape source (NVML, a probe) failed."""


class ActionError(WatchdogError):
    """An action could not be carried out; the message says which step and why."""


class RefusedError(ActionError):
    """The action would touch a container, process or unit that the config does not name."""
