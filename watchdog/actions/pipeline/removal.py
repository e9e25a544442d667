"""A target that leaves the config (a reload, or discovery): what it left pending is undone."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ..config import ActionConfig
from .decisions import Audit
from .jobqueues import JobQueues
from .restores import Restores
from .retries import Retries

REMOVED_RAIL = "target_removed"  # the rail of jobs that waited for a target the config no longer has


def removed(target: str) -> str:
    """The reason a job of a removed target is skipped with."""
    return f"{REMOVED_RAIL}: target {target} was removed from the config (reload or discovery)"


def forget_target(
    target: str,
    actions: Iterable[ActionConfig],
    jobs: JobQueues,
    audit: Audit,
    retries: Retries,
    restores: Restores,
    now: float,
    configured: Callable[[str], bool],
) -> None:
    """Its waiting jobs are skipped on the target_removed rail (the one running goes on to the end of its
    flow), its retries and restores cancelled (they would run if a target of that name came back), and its
    counts dropped (a discovery that comes and goes must not grow them forever), again once the running job
    has counted its outcome, unless the target is `configured` again by then."""
    for job in jobs.drop(target):
        result = audit.skip(job, REMOVED_RAIL, removed(target), now)
        if job.done is not None and not job.done.done():
            job.done.set_result(result)
    for action in actions:
        retries.forget(action.name, target)
        restores.cancel(action, target)
    audit.forget(target)
    worker = jobs.workers.get(target)
    if worker is not None and not worker.done():
        worker.add_done_callback(lambda _: None if configured(target) else audit.forget(target))
