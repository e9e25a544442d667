"""Action kinds are registered modules: each declares its traits, config defaults and keys, plan and execution;
every set of kinds is derived from the traits, and no module outside watchdog/actions/kinds/ names a kind."""

from __future__ import annotations

import ast
from pathlib import Path

from vllm_watchdog.actions.config import DRAFT_FLAGS, Budget, Traits, kind_names, traits_of
from vllm_watchdog.actions.kinds import kind_of

ROOT = Path(__file__).resolve().parent.parent.parent / "watchdog"
KINDS = ROOT / "actions" / "kinds"
# The same words name other concepts here: the restart flow (plans.py), the restart flow's drain, undrain and
# quarantine steps in the audit log (flows.py), the undrain step of a lifted quarantine (quarantines.py), and
# the gateway process's control verb `throttle` (its own protocol).
OTHER_CONCEPTS = {
    ("actions/pipeline/plans.py", "restart"),
    ("actions/pipeline/flows.py", "drain"),
    ("actions/pipeline/flows.py", "undrain"),
    ("actions/pipeline/flows.py", "quarantine"),
    ("actions/pipeline/quarantines.py", "undrain"),
}
SERVER = {"restart", "disable_draft", "enable_draft", "reconfigure", "recover", "draft_schedule"}
GATEWAY = {"throttle", "throttle_session", "drain", "undrain", "quarantine"}


def _with(trait: str) -> set[str]:
    return {name for name in kind_names() if getattr(traits_of(name), trait)}


def test_the_registry_lists_every_kind_in_the_order_the_config_error_names_them() -> None:
    assert kind_names() == (
        "restart",
        "disable_draft",
        "enable_draft",
        "reconfigure",
        "gpu_power_limit",
        "throttle",
        "throttle_session",
        "drain",
        "undrain",
        "quarantine",
        "recover",
        "draft_schedule",
    )
    assert all(kind_of(name).name == name for name in kind_names())
    assert traits_of("respawn-of-an-old-row") == Traits()  # an unknown type in an old audit row: no traits


def test_the_sets_derived_from_the_traits_are_the_ones_the_tree_kept_by_hand() -> None:
    for trait in (
        "stops_server",
        "one_at_a_time_per_target",
        "needs_startup_grace",
        "needs_writable_state",
        "needs_runtime",
    ):
        assert _with(trait) == SERVER, trait
    assert {n for n in kind_names() if not traits_of(n).allowed_while_paused_or_asleep} == SERVER
    assert _with("takes_fleet_slot") == _with("collects_evidence") == SERVER | {"gpu_power_limit"}
    assert _with("relaunches") == SERVER - {"restart", "recover"}
    assert _with("steers_gateway") == GATEWAY
    assert _with("once_per_episode") == {"throttle", "throttle_session", "drain", "quarantine"}
    assert _with("holds_gateway_cap") == {"throttle"}
    assert _with("acts_on_session") == {"throttle_session"}
    assert _with("needs_nvml") == {"gpu_power_limit"}


def test_each_kind_owns_its_defaults_and_keys() -> None:
    spec = {name: kind_of(name).spec for name in kind_names()}
    assert spec["restart"].defaults == {"cooldown": 900.0, "max_per_window": Budget(3, 6 * 3600.0)}
    assert spec["disable_draft"].defaults == {"cooldown": 3600.0, "remove_args": DRAFT_FLAGS}
    assert spec["enable_draft"].defaults == {"cooldown": 0.0}
    assert spec["reconfigure"].defaults == {"cooldown": 900.0} and spec["reconfigure"].keys == (
        "set",
        "remove",
    )
    assert spec["gpu_power_limit"].defaults == {"cooldown": 300.0}
    assert spec["gpu_power_limit"].keys == ("watts", "ratio")
    quick = {"crash_loop_window": 0.0, "startup_grace": 0.0}
    assert spec["throttle"].defaults == {"cooldown": 60.0, **quick}
    for name in ("throttle_session", "drain", "undrain", "quarantine"):
        assert spec[name].defaults == {"cooldown": 0.0, **quick}
    assert spec["throttle_session"].keys == ("duration", "max_duration", "reset_after")


def _literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    }


def test_no_module_outside_the_kinds_names_a_kind() -> None:
    names = set(kind_names())
    found: dict[str, set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        if path.is_relative_to(KINDS) or module.startswith("gateway/"):  # the gateway: its own protocol
            continue
        hits = {n for n in _literals(path) & names if (module, n) not in OTHER_CONCEPTS}
        if hits:
            found[module] = hits
    assert found == {}
    declaring = {p for p in KINDS.glob("*.py") if _literals(p) & names}
    # server, power, gateway, recover, draftschedule
    assert len(declaring) <= 5, sorted(p.name for p in declaring)
