"""Exit classification (runtimes/exits.py): vLLM 0.32's engine-death lines, Docker's State, the throttle."""

from __future__ import annotations

import pytest

from tests.support.clock import Clock
from vllm_watchdog.actions.runtimes.exits import ExitStatus, ExitWatch, docker_exit, engine_death

pytestmark = pytest.mark.anyio

# Lines vLLM 0.32 writes when its engine dies (v1/engine/core.py, exceptions.py, core_client.py, v1/utils.py),
# and the older wording issue reports quote.
DEATHS = [
    ("ERROR [core.py:1512] EngineCore encountered a fatal error.", "EngineCore encountered a fatal error"),
    ("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.", "EngineDeadError"),
    (
        "RuntimeError: Engine core process EngineCore_DP0 died unexpectedly.",
        "Engine core process EngineCore_DP0 died unexpectedly",
    ),
    (
        "Engine core proc EngineCore_DP0 died unexpectedly, shutting down client.",
        "Engine core proc EngineCore_DP0 died unexpectedly",
    ),
    (
        "WARNING [shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
        "engine core exited unexpectedly",
    ),
    (
        "RuntimeError: Engine core initialization failed. See root cause above.",
        "Engine core initialization failed",
    ),
    (
        "ERROR Worker proc VllmWorker-0 died unexpectedly (exit code: -9), shutting down executor.",
        "Worker proc VllmWorker-0 died unexpectedly",
    ),
]


@pytest.mark.parametrize(("line", "marker"), DEATHS)
def test_each_engine_death_line_is_found_as_its_marker_alone(line: str, marker: str) -> None:
    assert engine_death(["INFO Started server process", line, "INFO Shutting down"]) == marker


def test_a_clean_shutdown_has_no_death() -> None:
    clean = ["INFO Shutting down FastAPI HTTP server.", "INFO Waiting for application shutdown.", "engine ok"]
    assert engine_death(clean) == ""


def test_describe() -> None:
    assert ExitStatus(0).describe() == "exited with status 0 (a clean stop)"
    assert ExitStatus(-9).describe() == "exited with status -9 (a crash)"
    assert ExitStatus(None, detail="OOM-killed").crashed


EXITED = {"Status": "exited", "Running": False, "Restarting": False, "ExitCode": 0, "OOMKilled": False}


@pytest.mark.parametrize(
    ("state", "policy", "death", "crashed", "respawn"),
    [
        (EXITED, "on-failure", "EngineDeadError", True, True),  # #48966: Docker leaves it down
        (EXITED, "no", "EngineDeadError", True, True),
        (EXITED, "unless-stopped", "EngineDeadError", True, False),  # Docker starts it again
        (EXITED, "no", "", False, False),  # docker stop: an operator's, left alone
        ({**EXITED, "ExitCode": 1}, "no", "", True, False),  # left to the policy and the routes, as before
        ({**EXITED, "OOMKilled": True, "ExitCode": 0}, "no", "EngineDeadError", True, False),
    ],
)
def test_docker_exits(
    state: dict[str, object], policy: str, death: str, crashed: bool, respawn: bool
) -> None:
    status = docker_exit(state, policy, death)
    assert status is not None and (status.crashed, status.respawn) == (crashed, respawn)


def test_a_running_restarting_or_new_container_has_no_exit() -> None:
    for state in (
        {"Status": "running", "Running": True},
        {**EXITED, "Restarting": True},
        {"Status": "created"},
    ):
        assert docker_exit(state, "no", "EngineDeadError") is None


async def test_exit_watch_reads_at_most_every_5_seconds() -> None:
    clock, reads = Clock(), []

    async def read() -> ExitStatus | None:
        reads.append(clock())
        return ExitStatus(len(reads), respawn=False)  # a stop left alone: the same for a while

    watch = ExitWatch(read, clock)
    first, second = ExitStatus(1, respawn=False), ExitStatus(2, respawn=False)
    assert [await watch(), await watch()] == [first, first]
    clock.advance(4.9)
    assert await watch() == first
    clock.advance(0.1)
    assert await watch() == second and len(reads) == 2


async def test_a_reading_that_asks_for_a_respawn_is_handed_out_once() -> None:
    """The respawn it asks for may be done within the 5 s: a stale copy must not ask for a second one."""
    clock, reads = Clock(), []

    async def read() -> ExitStatus | None:
        reads.append(clock())
        return ExitStatus(0, "EngineDeadError", respawn=True)

    watch = ExitWatch(read, clock)
    assert await watch() == ExitStatus(0, "EngineDeadError", respawn=True)
    assert await watch() is None and len(reads) == 1
    clock.advance(5.0)
    assert (
        await watch() is not None and len(reads) == 2
    )  # still down 5 s later (the rails held it): asks again
