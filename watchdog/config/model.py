"""The config file: parsed once into frozen dataclasses, with file:line errors for every problem."""

from __future__ import annotations

import glob
import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

from ..actions.config import ActionConfig, IncidentConfig, RouteConfig, parse_incidents
from ..discovery.config import DockerSdConfig, FileSdConfig, parse_docker_sd, parse_file_sd
from ..errors import ConfigError, Problem
from ..fleet.config import FleetConfig, parse_fleet
from ..gateway.config import GatewayConfig, parse_gateway
from ..integrity.config import IntegrityConfig, parse_integrity
from ..notifiers.config import NotifierConfig
from ..redact import Redactor, secret, secret_headers, url_password
from ..ruler.config import RuleOverride, parse_rule_overrides
from ..sources.config import GpuConfig, parse_gpus
from .addresses import http_url, parse_listen
from .durations import parse_duration
from .files import UnreadableFileError, read_text, resolve_bundled
from .httpclient import HttpClientConfig, TlsConfig
from .httpkeys import HTTP_CLIENT_KEYS, parse_http_client
from .includes import BUNDLED_PREFIX, merge_remediation, read_includes
from .limits import LIMIT_KEYS, ScrapeLimits, parse_limits
from .targets import DEFAULT_JOB, TargetConfig, parse_target
from .yamlnodes import Node, Problems, compose, shown_value

DEFAULTS_NAME = "<embedded defaults>"
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class GlobalConfig:
    """Intervals and limits that apply to every target."""

    scrape_interval: float = 1.0
    scrape_timeout: float = 1.0
    evaluation_interval: float = 1.0
    limits: ScrapeLimits = field(default_factory=ScrapeLimits)  # of every target that does not set its own
    lookback_delta: float = 300.0
    keep_unreferenced: bool = False  # store families no rule reads (memory grows with targets)
    external_labels: Mapping[str, str] = field(default_factory=dict)  # added to alerts, as in Prometheus
    job: str = DEFAULT_JOB  # the `job` label of every target that does not name its own

    @property
    def sample_limit(self) -> int:
        """The sample_limit of the targets that set none."""
        return self.limits.sample_limit

    @property
    def body_size_limit(self) -> int:
        """The body_size_limit of the targets that set none."""
        return self.limits.body_size_limit


@dataclass(frozen=True)
class RemoteBackendConfig:
    """Evaluate rule expressions on a Prometheus-compatible server (Prometheus, Thanos, Mimir)."""

    url: str = field(metadata=secret(url_password))
    headers: Mapping[str, str] = field(default_factory=dict, metadata=secret(secret_headers))
    timeout: float = 10.0
    verify_tls: bool = True  # False is tls_config.insecure_skip_verify, which the client settings carry
    http: HttpClientConfig = field(default_factory=HttpClientConfig)  # TLS and credentials


@dataclass(frozen=True)
class Config:
    """The whole parsed config."""

    source: str
    global_: GlobalConfig = field(default_factory=GlobalConfig)
    listen_host: str = "127.0.0.1"
    listen_port: int = 9460
    api_token: str | None = field(default=None, metadata=secret())
    targets: tuple[TargetConfig, ...] = ()
    gpus: GpuConfig = field(default_factory=GpuConfig)
    rule_files: tuple[str, ...] = ()
    rule_overrides: tuple[RuleOverride, ...] = ()  # changes to loaded rules by name (ruler/config.py)
    rule_backend: RemoteBackendConfig | None = None  # None: the embedded evaluator
    state_dir: str | None = None  # None: alert state does not survive a restart
    routes: tuple[RouteConfig, ...] = ()
    actions: Mapping[str, ActionConfig] = field(default_factory=dict)
    notifiers: tuple[NotifierConfig, ...] = ()
    dry_run: bool = False  # every action only logs what it would do
    incidents: IncidentConfig = field(default_factory=IncidentConfig)  # evidence before disruptive actions
    # The watchdog's own URL as people reach it (Prometheus' --web.external-url): alerts' generatorURL.
    external_url: str = ""  # "": Prometheus' default for the listen address (web_external_url)
    runbook_base_url: str = ""  # relative runbook_url annotations resolve against it; "": the watchdog's own
    gateway: GatewayConfig | None = None  # None: no admission gateway
    fleet: FleetConfig | None = None  # None: this watchdog decides alone (no shared disruption budget)
    file_sd_configs: tuple[FileSdConfig, ...] = ()  # targets listed in files (Prometheus' file_sd)
    docker_sd_configs: tuple[DockerSdConfig, ...] = ()  # targets found as labelled containers
    integrity: IntegrityConfig = field(default_factory=IntegrityConfig)  # the known-answer probe
    # Values substituted from the environment into secret fields or from secret-named variables, and the
    # passwords and tokens read from credential files at load.
    env_secrets: tuple[str, ...] = field(default=(), repr=False, metadata=secret())

    @property
    def web_external_url(self) -> str:
        """`external_url`, or http://<listen host>:<port> when the config sets none (as Prometheus does)."""
        return self.external_url or default_external_url(self.listen_host, self.listen_port)

    @property
    def web_runbook_base_url(self) -> str:
        """`runbook_base_url`, or the external URL when the config sets none: the bundled rules' relative
        `docs/runbooks.md#<alert>` then opens the runbooks the watchdog serves itself (api/runbooks.py)."""
        return self.runbook_base_url or self.web_external_url + "/"

    @property
    def listens_on_loopback(self) -> bool:
        """True when the own API is reachable from this host only."""
        if self.listen_host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.listen_host).is_loopback
        except ValueError:
            return False


def default_external_url(host: str, port: int) -> str:
    """Prometheus' default --web.external-url: http://<host>:<port>, the machine's name for any address."""
    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _external_url(node: Node) -> str | None:
    """An http(s) URL with no query or fragment, without its trailing slash (as Prometheus keeps it)."""
    url = node.parsed(http_url)
    if url is not None and (urlsplit(url).query or urlsplit(url).fragment):
        node.error("must not have a query or fragment")
        return None
    return None if url is None else url.rstrip("/")


def bundled_rules_dir() -> Path:
    """The bundled rule files: inside an installed wheel, or `rules/` of a source checkout."""
    here = Path(__file__).resolve().parent.parent  # the package: this module sits in config/
    installed = here / "rules"
    return installed if installed.is_dir() else here.parent / "rules"


def bundled_includes_dir() -> Path:
    """The bundled includable files (the default actions and routes): the package's `defaults/`."""
    return Path(__file__).resolve().parent.parent / "defaults"


def _rule_files(node: Node, base: Path) -> tuple[str, ...]:
    out: list[str] = []
    for item in node.items():
        pattern = item.string()
        if pattern is None:
            continue
        if pattern.startswith(BUNDLED_PREFIX):
            name = pattern[len(BUNDLED_PREFIX) :]
            try:
                path = resolve_bundled(name, bundled_rules_dir())
            except UnreadableFileError as exc:
                item.error(str(exc))
                continue
            if not path.is_file():
                item.error(f"no bundled rule file {shown_value(name)}")
            out.append(str(path))
            continue
        full = pattern if os.path.isabs(pattern) else str(base / pattern)
        if glob.has_magic(full):  # every match is read by read_text, which refuses FIFOs and devices
            out.extend(sorted(glob.glob(full)))
        elif not os.path.lexists(full):
            item.error(f"rule file {full} does not exist")
        else:
            out.append(full)
    return tuple(out)


def _state_dir(node: Node, base: Path) -> str | None:
    text = node.scalar()
    if not text:
        return None
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else base / path)


def _positive_duration(m: dict[str, Node], key: str) -> float | None:
    value = m[key].parsed(parse_duration) if key in m else None
    if value == 0:
        m[key].error("must be greater than 0")
        return None
    return value


def _global(node: Node) -> GlobalConfig:
    d = GlobalConfig()
    m = node.mapping(
        {"scrape_interval", "scrape_timeout", "evaluation_interval", "lookback_delta", "keep_unreferenced"}
        | {"external_labels", "job"}
        | LIMIT_KEYS
    )
    if m is None:
        return d
    interval = _positive_duration(m, "scrape_interval") or d.scrape_interval
    timeout = m["scrape_timeout"].parsed(parse_duration) if "scrape_timeout" in m else None
    if timeout is not None and timeout > interval:
        m["scrape_timeout"].error("must not be greater than scrape_interval")
    ev = _positive_duration(m, "evaluation_interval")
    lookback = _positive_duration(m, "lookback_delta")
    keep = m["keep_unreferenced"].boolean() if "keep_unreferenced" in m else None
    job = m["job"].string() if "job" in m else None
    if "job" in m and not job:
        m["job"].error("must not be empty")
    return GlobalConfig(
        scrape_interval=interval,
        scrape_timeout=timeout or min(interval, 10.0),
        evaluation_interval=ev or d.evaluation_interval,
        limits=replace(ScrapeLimits(), **parse_limits(m)),
        lookback_delta=lookback or d.lookback_delta,
        keep_unreferenced=bool(keep),
        external_labels=_external_labels(m["external_labels"]) if "external_labels" in m else {},
        job=job or d.job,
    )


def _external_labels(node: Node) -> dict[str, str]:
    labels = node.string_map() or {}
    for key in labels:
        if not _LABEL.match(key) or key.startswith("__"):
            node.error(f"invalid label name {key!r}")
    return labels


def _rule_backend(node: Node) -> RemoteBackendConfig | None:
    m = node.mapping({"embedded", "prometheus"})
    if m is None or len(m) != 1:
        if m is not None:
            node.error("set exactly one of 'embedded' or 'prometheus'")
        return None
    if "embedded" in m:
        return None
    p = m["prometheus"].mapping({"url", "headers", "timeout", "verify_tls"} | HTTP_CLIENT_KEYS)
    if p is None:
        return None
    if "url" not in p:
        m["prometheus"].error("is required", field=f"{m['prometheus'].path}.url")
        return None
    url = p["url"].parsed(http_url)
    timeout = _positive_duration(p, "timeout")
    verify = p["verify_tls"].boolean() if "verify_tls" in p else None
    headers = (p["headers"].string_map() or {}) if "headers" in p else {}
    http = parse_http_client(p, m["prometheus"], headers)
    if verify is False and "tls_config" in p:
        p["verify_tls"].error("set tls_config.insecure_skip_verify instead, next to the other TLS settings")
    elif verify is False:
        http = replace(http, tls=TlsConfig(insecure_skip_verify=True))
    if url is None:
        return None
    return RemoteBackendConfig(
        url=url,
        headers=headers,
        timeout=timeout or 10.0,
        verify_tls=not http.tls.insecure_skip_verify,
        http=http,
    )


TOP_LEVEL_KEYS = {
    "global",
    "listen",
    "api_token",
    "targets",
    "gpus",
    "rule_files",
    "rule_overrides",
    "rule_backend",
    "state_dir",
    "routes",
    "actions",
    "notifiers",
    "dry_run",
    "gateway",
    "include",
    "external_url",
    "runbook_base_url",
    "fleet",
    "file_sd_configs",
    "docker_sd_configs",
    "incidents",
    "integrity",
}


def _top(text: str, problems: Problems, env: Mapping[str, str] | None) -> dict[str, Node]:
    """The config's top-level mapping; ConfigError when the text is empty, not YAML or not a mapping."""
    root = compose(text, problems)
    if root is None and not problems.items:
        problems.add(None, "(root)", "config is empty")
    if root is None:
        raise ConfigError(problems.items)
    top = Node(root, "", problems, env).mapping(TOP_LEVEL_KEYS)
    if top is None:
        raise ConfigError(_masked(problems))
    return top


def _targets(node: Node, job: str) -> list[TargetConfig]:
    """The `targets:` list, each name once."""
    targets: list[TargetConfig] = []
    for item in node.items():
        target = parse_target(item, job)
        if target is not None and any(t.name == target.name for t in targets):
            item.error(f"duplicate target name {target.name!r}", field=f"{item.path}.name")
        elif target is not None:
            targets.append(target)
    return targets


def _gateway(node: Node, targets: list[TargetConfig], listen: tuple[str, int] | None) -> GatewayConfig | None:
    """The `gateway:` section, which fronts the targets and must not take the API's `listen`."""
    return parse_gateway(node, {t.name: t.url for t in targets}, parse_listen, listen or ("127.0.0.1", 9460))


def parse_config(text: str, source: str, env: Mapping[str, str] | None = None) -> Config:
    """Parse config text; raise ConfigError listing every problem with file:line: field."""
    problems = Problems(source)
    top = _top(text, problems, env)
    base = Path(source).parent if source != DEFAULTS_NAME else bundled_rules_dir()
    listen = top["listen"].parsed(parse_listen) if "listen" in top else None
    global_ = _global(top["global"]) if "global" in top else GlobalConfig()
    targets = _targets(top["targets"], global_.job) if "targets" in top else []
    parts = read_includes(top["include"], base, bundled_includes_dir(), env) if "include" in top else []
    actions, routes, notifiers = merge_remediation(top, parts, http_url)
    for part in parts:
        problems.items.extend(part.problems.items)
        problems.secrets.extend(part.problems.secrets)
    gateway = _gateway(top["gateway"], targets, listen) if "gateway" in top else None
    cfg = Config(
        source=source,
        global_=global_,
        listen_host=listen[0] if listen else "127.0.0.1",
        listen_port=listen[1] if listen else 9460,
        api_token=(top["api_token"].scalar() or None) if "api_token" in top else None,
        targets=tuple(targets),
        gpus=parse_gpus(top["gpus"], http_url) if "gpus" in top else GpuConfig(),
        rule_files=_rule_files(top["rule_files"], base) if "rule_files" in top else (),
        rule_overrides=parse_rule_overrides(top["rule_overrides"]) if "rule_overrides" in top else (),
        rule_backend=_rule_backend(top["rule_backend"]) if "rule_backend" in top else None,
        state_dir=_state_dir(top["state_dir"], base) if "state_dir" in top else None,
        routes=routes,
        actions=actions,
        notifiers=notifiers,
        dry_run=bool(top["dry_run"].boolean()) if "dry_run" in top else False,
        incidents=parse_incidents(top["incidents"]) if "incidents" in top else IncidentConfig(),
        gateway=gateway,
        fleet=parse_fleet(top["fleet"]) if "fleet" in top else None,
        file_sd_configs=parse_file_sd(top["file_sd_configs"], base, global_.job)
        if "file_sd_configs" in top
        else (),
        docker_sd_configs=parse_docker_sd(top["docker_sd_configs"], global_.job)
        if "docker_sd_configs" in top
        else (),
        integrity=parse_integrity(top["integrity"], base) if "integrity" in top else IntegrityConfig(),
        external_url=(_external_url(top["external_url"]) if "external_url" in top else None) or "",
        runbook_base_url=(top["runbook_base_url"].parsed(http_url) if "runbook_base_url" in top else None)
        or "",
        env_secrets=tuple(problems.secrets),
    )
    if problems.items:
        raise ConfigError(_masked(problems), rule_files=cfg.rule_files)
    return cfg


def _masked(problems: Problems) -> list[Problem]:
    """The problems with secrets masked as the log masks them, so `check`, the log and /-/reload agree."""
    red = Redactor.of(problems.secrets)
    return [replace(p, field=red.text(p.field), message=red.text(p.message)) for p in problems.items]


def load_config(path: str | None, env: Mapping[str, str] | None = None) -> Config:
    """Load a config file, or the embedded defaults when path is None."""
    if path is None:
        text = resources.files("vllm_watchdog").joinpath("defaults/config.yml").read_text()
        return parse_config(text, DEFAULTS_NAME, env)
    try:
        text = read_text(path)
    except UnreadableFileError as exc:
        raise ConfigError([Problem(path, 1, "(file)", f"cannot read: {exc}")]) from None
    return parse_config(text, path, env)
