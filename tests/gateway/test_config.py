"""The `gateway:` section and the gateway actions in the config: typed values and file:line errors."""

from __future__ import annotations

import pytest

from vllm_watchdog.config.model import load_config, parse_config
from vllm_watchdog.errors import ConfigError
from vllm_watchdog.gateway.config import GatewayConfig, MiB, PriorityConfig, SessionConfig, ThrottleSpec

TARGET = 'targets:\n  - {name: vllm-0, url: "http://127.0.0.1:8000"}\n'

FULL = (
    TARGET
    + """gateway:
  listen: 127.0.0.1:8001
  target: vllm-0
  max_body: 2MiB
  max_in_flight: 32
  max_queue: 100
  max_queue_time: 20s
  drain_mode: reject
  drain_max_wait: 2m
  connect_timeout: 2s
  read_timeout: 5m
  client_timeout: 15s
  write_timeout: 10s
  max_json_elements: 50000
  keepalive_timeout: 30s
  priority: {header: X-Tier, classes: [gold, silver, bronze], default: silver, api_keys: {sk-batch: bronze}}
  sessions: {header: X-Agent, rate: 2.5, burst: 5, max_in_flight: 4, breaker_duration: 10m, max_sessions: 500, top_k: 5,
    anonymous_share: 0.25}
actions:
  squeeze: {type: throttle, factor: 0.25, floor: 4, step: 2, step_interval: 30s}
  pin: {type: throttle, limit: 8}
  follow: {type: throttle, adaptive: ttft, target: 2s}
  breaker: {type: throttle_session, duration: 15m}
  hold: {type: drain}
  release: {type: undrain}
"""
)


def errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        parse_config(text, "c.yml", env={})
    return [str(p) for p in exc.value.problems]


def test_every_gateway_key_parses_into_typed_values() -> None:
    cfg = parse_config(FULL, "c.yml", env={})
    assert cfg.gateway == GatewayConfig(
        target="vllm-0",
        upstream="http://127.0.0.1:8000",
        listen_host="127.0.0.1",
        listen_port=8001,
        max_body=2 * MiB,
        max_in_flight=32,
        max_queue=100,
        max_queue_time=20.0,
        drain_mode="reject",
        drain_max_wait=120.0,
        connect_timeout=2.0,
        read_timeout=300.0,
        client_timeout=15.0,
        write_timeout=10.0,
        max_json_elements=50_000,
        keepalive_timeout=30.0,
        priority=PriorityConfig("X-Tier", ("gold", "silver", "bronze"), "silver", {"sk-batch": "bronze"}),
        sessions=SessionConfig("X-Agent", 2.5, 5, 4, 600.0, 500, 5, 0.25),
    )
    a = cfg.actions
    assert a["squeeze"].throttle == ThrottleSpec(factor=0.25, floor=4, step=2, step_interval=30.0)
    assert a["pin"].throttle == ThrottleSpec(factor=None, limit=8)
    assert a["follow"].throttle == ThrottleSpec(factor=0.5, adaptive="ttft", target=2.0)
    assert a["breaker"].breaker_duration == 900.0
    assert {a["hold"].type, a["release"].type} == {"drain", "undrain"}
    # gateway actions are cheap and reversible: no start-up grace, no crash-loop stop, no disruption
    assert all(
        x.startup_grace == 0 and x.crash_loop_window == 0 and not x.disruptive
        for x in (a["squeeze"], a["breaker"], a["hold"])
    )


def test_minimal_gateway_takes_the_only_target_and_safe_defaults() -> None:
    cfg = parse_config(TARGET + "gateway: {}\n", "c.yml", env={})
    assert cfg.gateway is not None
    assert (cfg.gateway.target, cfg.gateway.upstream) == ("vllm-0", "http://127.0.0.1:8000")
    assert (cfg.gateway.listen_host, cfg.gateway.listen_port) == ("127.0.0.1", 8080)
    assert cfg.gateway.max_body == 16 * MiB and cfg.gateway.drain_mode == "hold"
    assert (cfg.gateway.write_timeout, cfg.gateway.max_json_elements) == (30.0, 1_000_000)
    assert cfg.gateway.sessions.anonymous_share == 0.75
    assert parse_config(TARGET, "c.yml", env={}).gateway is None


def test_embedded_defaults_put_a_loopback_gateway_in_front_with_agent_guards() -> None:
    cfg = load_config(None, env={})
    assert cfg.gateway is not None and cfg.gateway.listen_host == "127.0.0.1"
    assert cfg.actions["throttle-gateway"].type == "throttle"
    assert cfg.actions["session-breaker"].type == "throttle_session"
    assert any(p.endswith("gateway.rules.yml") for p in cfg.rule_files)


@pytest.mark.parametrize(
    ("gateway", "message"),
    [
        ("{listen: 127.0.0.1:9460}", "gateway.listen: must differ from `listen`"),
        ("{listen: 127.0.0.1:8000}", "gateway.listen: is the address of its own target"),
        ("{listen: nowhere}", "gateway.listen: must be host:port"),
        ("{target: vllm-9}", "gateway.target: unknown target 'vllm-9' (configured: vllm-0)"),
        ("{max_body: lots}", "gateway.max_body: not a valid size"),
        ("{max_in_flight: 0}", "gateway.max_in_flight: must be >= 1"),
        ("{max_queue_time: 0s}", "gateway.max_queue_time: must be greater than 0"),
        ("{drain_mode: pause}", "gateway.drain_mode: must be hold or reject"),
        ("{read_timeout: soon}", "gateway.read_timeout:"),
        ("{bogus: 1}", "gateway.bogus: unknown key"),
        ("{priority: {classes: []}}", "gateway.priority.classes: must list at least one class"),
        ("{priority: {classes: [a, a]}}", "gateway.priority.classes: classes must be distinct"),
        ("{priority: {default: gold}}", "gateway.priority.default: must be one of the classes"),
        ("{priority: {api_keys: {k: gold}}}", "gateway.priority.api_keys: an API key maps to unknown class"),
        ("{priority: {header: 'a b'}}", "gateway.priority.header: must be an HTTP header name"),
        ("{sessions: {rate: -1}}", "gateway.sessions.rate: must be greater than 0"),
        ("{sessions: {max_in_flight: 0}}", "gateway.sessions.max_in_flight: must be >= 1"),
        ("{sessions: {top_k: 0}}", "gateway.sessions.top_k: must be >= 1"),
        ("{sessions: {anonymous_share: 0}}", "gateway.sessions.anonymous_share: must be greater than 0"),
        ("{sessions: {anonymous_share: 1.5}}", "gateway.sessions.anonymous_share: must be greater than 0"),
        ("{sessions: {anonymous_share: half}}", "gateway.sessions.anonymous_share: must be a number"),
        ("{write_timeout: 0s}", "gateway.write_timeout: must be greater than 0"),
        ("{max_json_elements: 0}", "gateway.max_json_elements: must be >= 1"),
        ("[1]", "gateway: must be a mapping"),
        (
            "{control_socket: gw.sock}",
            "gateway.control_socket: must be an absolute path of at most 107 bytes",
        ),
        ("{control_socket: /" + "a" * 120 + "}", "gateway.control_socket: must be an absolute path"),
        ("{control_lease: 0s}", "gateway.control_lease: must be greater than 0"),
        ("{supervise: maybe}", "gateway.supervise:"),
    ],
)
def test_bad_gateway_settings_name_file_line_and_field(gateway: str, message: str) -> None:
    problems = errors(TARGET + f"gateway: {gateway}\n")
    assert any(p.startswith("c.yml:3: ") and message in p for p in problems), problems


def test_gateway_needs_a_target_when_there_are_several() -> None:
    text = TARGET + '  - {name: vllm-1, url: "http://127.0.0.1:8001"}\ngateway: {listen: 127.0.0.1:8100}\n'
    assert any("gateway.target: is required" in p for p in errors(text))


def test_api_keys_never_appear_in_errors() -> None:
    problems = errors(TARGET + "gateway: {priority: {api_keys: {sk-secret-123: nope}}}\n")
    assert problems and not any("sk-secret-123" in p for p in problems)


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("{type: throttle, factor: 1.5}", "actions.a.factor: must be between 0 and 1"),
        ("{type: throttle, factor: 0.5, limit: 4}", "actions.a: set `factor` or `limit`, not both"),
        ("{type: throttle, limit: 2, floor: 4}", "actions.a.limit: must not be below floor (4)"),
        ("{type: throttle, adaptive: latency}", "actions.a.adaptive: must be one of queue_time, ttft"),
        ("{type: throttle, target: 2s}", "actions.a.target: only applies with `adaptive`"),
        ("{type: throttle, step_interval: 0s}", "actions.a.step_interval: must be greater than 0"),
        ("{type: restart, factor: 0.5}", "actions.a.factor: only applies to type throttle"),
        ("{type: throttle_session, duration: 0s}", "actions.a.duration: must be greater than 0"),
        ("{type: drain, duration: 1m}", "actions.a.duration: only applies to type throttle_session"),
    ],
)
def test_bad_gateway_actions_name_file_line_and_field(action: str, message: str) -> None:
    problems = errors(TARGET + f"actions:\n  a: {action}\n")
    assert any(p.startswith("c.yml:4: ") and message in p for p in problems), problems


def test_connection_cap_and_allowed_admin_paths_parse_and_unknown_admin_paths_are_refused() -> None:
    text = TARGET + "gateway:\n  max_connections: 100\n  allow_admin_paths: [/pause, /resume, /adapters]\n"
    cfg = parse_config(text, "c.yml", env={})
    assert cfg.gateway is not None
    assert (cfg.gateway.max_connections, cfg.gateway.allow_admin_paths) == (
        100,
        ("/pause", "/resume", "/adapters"),
    )
    problems = errors(TARGET + "gateway:\n  max_connections: 0\n  allow_admin_paths: [/v1/completions]\n")
    assert any("c.yml:4" in p and "max_connections" in p for p in problems), problems
    assert any("c.yml:5" in p and "'/v1/completions' is not an admin path" in p for p in problems), problems


def test_the_gateway_process_keys_parse() -> None:
    """Who runs the gateway process, where its control socket is, and how long its holds outlive the daemon."""
    default = parse_config(TARGET + "gateway: {}\n", "c.yml", env={}).gateway
    assert default is not None
    assert (default.supervise, default.control_socket, default.control_lease) == (True, None, 60.0)
    text = TARGET + "gateway: {supervise: false, control_socket: /run/vw/gw.sock, control_lease: 2m}\n"
    gw = parse_config(text, "c.yml", env={}).gateway
    assert gw is not None
    assert (gw.supervise, gw.control_socket, gw.control_lease) == (False, "/run/vw/gw.sock", 120.0)
