"""`include:`: actions, routes and notifiers from other files, merged with file:line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_watchdog.config.model import bundled_includes_dir, load_config
from vllm_watchdog.errors import ConfigError

TARGET = "targets: [{name: vllm-0, url: 'http://127.0.0.1:8000', container: vllm-0}]\n"

SHARED = """\
actions:
  restart-it: {type: restart, cooldown: 30m}
  throttle-it: {type: throttle, factor: 0.5}
routes:
  - match: {alertname: Hung}
    actions: [restart-it]
  - match: {alertname: Busy}
    actions: [throttle-it]
notifiers:
  - {type: webhook, url: 'http://127.0.0.1:9/shared'}
"""

MORE = """\
actions:
  drain-it: {type: drain}
routes:
  - match: {alertname: Maintenance}
    actions: [drain-it, restart-it]
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def problems(path: Path, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_config(str(path), env=env or {})
    return [str(p) for p in exc.value.problems]


def test_own_actions_override_own_routes_come_first_then_included_in_order(tmp_path: Path) -> None:
    write(tmp_path / "conf.d" / "shared.yml", SHARED)
    write(tmp_path / "conf.d" / "more.yml", MORE)
    main = write(
        tmp_path / "watchdog.yml",
        TARGET + "include: [conf.d/shared.yml, conf.d/more.yml]\n"
        "actions:\n"
        "  restart-it: {type: restart, cooldown: 5m}\n"  # overrides the shared one
        "routes:\n"
        "  - match: {alertname: Busy}\n"
        "    actions: [restart-it]\n"
        "notifiers:\n"
        "  - {type: alertmanager, url: 'http://127.0.0.1:9093'}\n",
    )
    cfg = load_config(str(main), env={})
    assert cfg.actions["restart-it"].cooldown == 300.0
    assert cfg.actions["restart-it"].line == 4 and cfg.actions["throttle-it"].line == 3
    assert set(cfg.actions) == {"restart-it", "throttle-it", "drain-it"}
    order = [(str(r.matchers[0]), r.actions) for r in cfg.routes]
    assert order == [
        ("alertname='Busy'", ("restart-it",)),  # own first: it wins over the included Busy route
        ("alertname='Hung'", ("restart-it",)),
        ("alertname='Busy'", ("throttle-it",)),
        ("alertname='Maintenance'", ("drain-it", "restart-it")),
    ]
    assert [(n.name, n.type) for n in cfg.notifiers] == [
        ("alertmanager-0", "alertmanager"),
        ("webhook-1", "webhook"),
    ]


def test_paths_are_relative_to_the_including_file_not_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "etc" / "shared.yml", SHARED)
    main = write(tmp_path / "etc" / "watchdog.yml", TARGET + "include: [shared.yml]\n")
    monkeypatch.chdir(tmp_path)
    assert set(load_config("etc/watchdog.yml", env={}).actions) == {"restart-it", "throttle-it"}
    assert set(load_config(str(main), env={}).actions) == {"restart-it", "throttle-it"}


def test_included_files_see_environment_variables(tmp_path: Path) -> None:
    write(tmp_path / "n.yml", "notifiers:\n  - {type: webhook, url: '${HOOK}', name: hook}\n")
    main = write(tmp_path / "w.yml", TARGET + "include: [n.yml]\n")
    cfg = load_config(str(main), env={"HOOK": "http://127.0.0.1:8088/x"})
    assert [n.url for n in cfg.notifiers] == ["http://127.0.0.1:8088/x"]
    assert problems(main) == [
        f"{tmp_path}/n.yml:2: notifiers[0].url: environment variable HOOK is not set (use ${{VAR:-default}})"
    ]


def test_own_routes_may_use_included_actions_and_included_routes_own_actions(tmp_path: Path) -> None:
    write(tmp_path / "r.yml", "routes:\n  - match: {alertname: Hot}\n    actions: [mine]\n")
    main = write(
        tmp_path / "w.yml",
        TARGET + "include: [r.yml, bundled:watchdog.yml]\nactions: {mine: {type: drain}}\n"
        "routes: [{match: {alertname: X}, actions: [graceful-restart]}]\n",
    )
    cfg = load_config(str(main), env={})
    assert cfg.routes[0].actions == ("graceful-restart",) and cfg.routes[1].actions == ("mine",)


def test_bundled_watchdog_yml_holds_the_default_actions_and_routes(tmp_path: Path) -> None:
    main = write(tmp_path / "w.yml", TARGET + "include: ['bundled:watchdog.yml']\n")
    cfg = load_config(str(main), env={})
    restart = cfg.actions["graceful-restart"]
    assert restart.type == "restart" and restart.max_per_window is not None
    assert (restart.max_per_window.count, restart.max_per_window.window) == (3, 6 * 3600.0)
    assert (restart.cooldown, restart.startup_grace) == (900.0, 600.0)
    draft = cfg.actions["disable-draft"]
    assert draft.type == "disable_draft" and draft.restore_after == 7200.0
    assert cfg.actions["throttle-gateway"].type == "throttle" and cfg.notifiers == ()
    assert str(cfg.routes[0].matchers[0]) == "alertname=~'VLLMEngineHung|VLLMEngineStalled|VLLMDown'"
    answers = cfg.actions["answers-restart"]  # one restart for wrong answers, then the quarantine
    assert answers.type == "restart" and answers.max_per_window is not None and answers.cooldown == 3600.0
    assert (answers.max_per_window.count, answers.max_per_window.window) == (1, 6 * 3600.0)
    assert (answers.drain_timeout, answers.stop_timeout, answers.ready_timeout) == (
        restart.drain_timeout,
        restart.stop_timeout,
        restart.ready_timeout,
    )
    assert [r.actions for r in cfg.routes if "VLLMAnswersDiverged" in str(r.matchers)] == [
        ("answers-restart",)
    ]
    recover = cfg.actions["engine-recover"]  # vLLM's own retry first, a restart with the same bounds else
    assert recover.type == "recover" and recover.max_per_window == restart.max_per_window
    assert [r.actions for r in cfg.routes if "VLLMEngineAwaitingRetry" in str(r.matchers)] == [
        ("engine-recover",)
    ]


def test_embedded_defaults_include_the_bundled_file() -> None:
    cfg = load_config(None, env={})
    assert {
        "graceful-restart",
        "disable-draft",
        "throttle-gateway",
        "throttle-heat",
        "session-breaker",
        "answers-restart",
    } <= set(cfg.actions)
    assert cfg.targets[0].canary.enabled and cfg.gateway is not None
    assert [Path(p).name for p in cfg.rule_files] == ["vllm.rules.yml", "gateway.rules.yml"]


def test_a_missing_file_is_named_at_the_include_line(tmp_path: Path) -> None:
    main = write(tmp_path / "w.yml", TARGET + "include:\n  - nothere.yml\n  - bundled:nothing.yml\n")
    got = problems(main)
    assert got[0].startswith(f"{main}:3: include[0]: cannot read included file {tmp_path}/nothere.yml (")
    assert got[1].startswith(
        f"{main}:4: include[1]: cannot read included file {bundled_includes_dir()}/nothing.yml"
    )


def test_errors_inside_an_included_file_carry_its_name_and_line(tmp_path: Path) -> None:
    bad = write(
        tmp_path / "bad.yml",
        "actions:\n"
        "  ok: {type: restart}\n"
        "  nope: {type: reboot}\n"
        "routes:\n"
        "  - match: {alertname: A}\n"
        "    actions: [ok, missing]\n"
        "notifiers:\n"
        "  - {type: webhook}\n",
    )
    main = write(tmp_path / "w.yml", TARGET + "include: [bad.yml]\n")
    got = problems(main)
    assert f"{bad}:3: actions.nope.type: unknown action type 'reboot'" in got[0]
    assert got[1].startswith(f"{bad}:6: routes[0].actions: unknown action 'missing' (declared: nope, ok)")
    assert got[2] == f"{bad}:8: notifiers[0].url: is required"
    assert len(got) == 3


def test_yaml_errors_unknown_keys_nesting_and_empty_files(tmp_path: Path) -> None:
    write(tmp_path / "syntax.yml", "actions:\n  a: {type: restart\n")
    write(tmp_path / "keys.yml", "targets: []\nactions: {}\n")
    write(tmp_path / "nested.yml", "include: [keys.yml]\n")
    write(tmp_path / "empty.yml", "")
    main = write(tmp_path / "w.yml", TARGET + "include: [syntax.yml, keys.yml, nested.yml, empty.yml]\n")
    got = problems(main)
    assert any(p.startswith(f"{tmp_path}/syntax.yml:3: (yaml): ") for p in got), got
    assert f"{tmp_path}/keys.yml:1: targets: an included file holds only actions, routes, notifiers" in got
    assert f"{tmp_path}/nested.yml:1: include: an included file cannot include other files" in got
    assert f"{tmp_path}/empty.yml:1: (root): included file is empty" in got
    assert len(got) == 4


def test_a_file_included_twice_or_itself_is_refused(tmp_path: Path) -> None:
    write(tmp_path / "s.yml", SHARED)
    main = write(tmp_path / "w.yml", TARGET + "include: [s.yml, ./s.yml, w.yml]\n")
    got = problems(main)
    assert f"{main}:2: include[1]: ./s.yml is already included (line 2)" in got
    assert f"{main}:2: include: an included file cannot include other files" in got
    assert any(p.startswith(f"{main}:1: targets: an included file holds only") for p in got)


def test_two_included_files_may_not_define_the_same_action(tmp_path: Path) -> None:
    write(tmp_path / "a.yml", "actions:\n  r: {type: restart}\n")
    b = write(tmp_path / "b.yml", "# b\nactions:\n  r: {type: restart, cooldown: 1m}\n")
    main = write(tmp_path / "w.yml", TARGET + "include: [a.yml, b.yml]\n")
    assert problems(main) == [f"{b}:3: actions.r: action 'r' is already defined in {tmp_path}/a.yml:2"]
    # ...unless the including file settles it with its own
    write(main, TARGET + "include: [a.yml, b.yml]\nactions: {r: {type: restart, cooldown: 2m}}\n")
    assert load_config(str(main), env={}).actions["r"].cooldown == 120.0


def test_include_must_be_a_list_of_strings(tmp_path: Path) -> None:
    main = write(tmp_path / "w.yml", TARGET + "include: {a: b}\n")
    assert problems(main) == [f"{main}:2: include: must be a list"]
    write(main, TARGET + "include: ['']\n")
    assert problems(main) == [f"{main}:2: include[0]: must not be empty"]


SHADOW = (
    "root:$6$saltsalt$SECRETHASHroot0123456789abcdefABCDEF:19000:0:99999:7:::\n"
    "daemon:*:19000:0:99999:7:::\n"
    "svc:$y$j9T$SECRETHASHsvc/9876543210zyxw:19500:0:99999:7:::\n"
    "password: SECRETPLAIN-value-1234567890\n"
)


def test_an_include_symlinked_to_a_password_file_is_reported_without_its_lines(tmp_path: Path) -> None:
    shadow = write(tmp_path / "etc" / "shadow", SHADOW)
    (tmp_path / "inc.yml").symlink_to(shadow)
    main = write(tmp_path / "w.yml", TARGET + "include: [inc.yml]\n")
    got = problems(main)
    assert all("SECRET" not in p and "$6$" not in p and "19000" not in p for p in got), got
    inc = f"{tmp_path}/inc.yml"
    assert f"{inc}:1: <field at line 1>: an included file holds only actions, routes, notifiers" in got
    assert f"{inc}:3: <field at line 3>: an included file holds only actions, routes, notifiers" in got
    assert f"{inc}:4: password: an included file holds only actions, routes, notifiers" in got


def test_a_main_config_that_is_a_password_file_is_reported_without_its_lines(tmp_path: Path) -> None:
    main = write(tmp_path / "w.yml", SHADOW)
    got = problems(main)
    assert all("SECRET" not in p and "$6$" not in p for p in got), got
    assert got[0].startswith(f"{main}:1: (root): unknown field at line 1 (allowed: actions, api_token,")
    assert got[-1].startswith(f"{main}:4: password: unknown key (allowed: ")


def test_a_binary_include_is_refused_without_quoting_it(tmp_path: Path) -> None:
    (tmp_path / "blob.yml").write_bytes(b"\x7fELF\x02\x01SECRETBYTES\xff\xfe\x00")
    (tmp_path / "ctl.yml").write_bytes(b"SECRETKEY\x00\x01: SECRETVALUE\n")  # UTF-8, but not YAML text
    main = write(tmp_path / "w.yml", TARGET + "include: [blob.yml, ctl.yml]\n")
    assert problems(main) == [
        f"{tmp_path}/ctl.yml:1: (yaml): unacceptable character #x0000",
        f"{main}:2: include[0]: cannot read included file {tmp_path}/blob.yml (not UTF-8 text at byte 17)",
    ]


def test_yaml_syntax_errors_do_not_quote_names_from_the_file(tmp_path: Path) -> None:
    write(tmp_path / "alias.yml", "actions: *SECRETALIAS\n")
    main = write(tmp_path / "w.yml", TARGET + "include: [alias.yml]\n")
    got = problems(main)
    assert got == [f"{tmp_path}/alias.yml:1: (yaml): found undefined alias '…'"]


def test_bundled_cannot_leave_the_bundled_folder(tmp_path: Path) -> None:
    main = write(
        tmp_path / "w.yml",
        TARGET + "include: ['bundled:../../../../../../../../etc/passwd', 'bundled:/etc/passwd']\n",
    )
    got = problems(main)
    assert len(got) == 2, got
    for i, p in enumerate(got):
        assert p.startswith(f"{main}:2: include[{i}]: cannot read included file bundled:")
        assert p.endswith("passwd (a bundled name must stay inside the bundled folder)")


def test_a_fifo_or_a_device_include_is_refused_at_once(tmp_path: Path) -> None:
    import os

    os.mkfifo(tmp_path / "fifo.yml")
    (tmp_path / "zero.yml").symlink_to("/dev/zero")
    main = write(tmp_path / "w.yml", TARGET + "include: [fifo.yml, zero.yml, /proc/self/environ]\n")
    assert problems(main) == [
        f"{main}:2: include[0]: cannot read included file {tmp_path}/fifo.yml (not a regular file but a FIFO)",
        f"{main}:2: include[1]: cannot read included file {tmp_path}/zero.yml "
        "(not a regular file but a character device)",
        f"{main}:2: include[2]: cannot read included file /proc/self/environ "
        "(not a regular file but a kernel pseudo-file)",
    ]
