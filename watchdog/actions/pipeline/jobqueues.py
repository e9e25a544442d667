"""One queue and one worker per target: jobs run in order, an equal job waiting or running absorbs a new one,
and a full queue skips it on the queue_full rail."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from .decisions import Job
from .rails import Verdict

log = logging.getLogger("vllm_watchdog.actions.remediator")
# Jobs waiting per target; past this a new one is skipped on the queue_full rail (audited, counted), not
# queued: 8,500 distinct sessions in one webhook queued 8,500 jobs and kept the loop busy for 48 s.
MAX_QUEUED = 64
QUEUE_RAIL = "queue_full"


class JobQueues:
    """The waiting and running jobs of every target, and the worker task that runs each target's in order:
    `run` executes a job, `skip` records one turned away, and no worker starts a job before `ready` is set."""

    def __init__(
        self,
        run: Callable[[Job], Awaitable[dict[str, Any]]],
        skip: Callable[[Job, Verdict], dict[str, Any]],
        ready: asyncio.Event,
    ) -> None:
        self.run = run
        self.skip = skip
        self.ready = ready
        self.queues: dict[str, deque[Job]] = {}
        self.current: dict[str, Job] = {}
        self.workers: dict[str, asyncio.Task[None]] = {}

    def idle(self, target: str) -> bool:
        """Whether `target` runs no job and has none waiting."""
        return target not in self.current and not self.queues.get(target)

    def enqueue(self, job: Job) -> int:
        """Queue a job on its target's worker, merged with an equal one already waiting or running, or skipped
        (queue_full) when MAX_QUEUED already wait."""
        name = job.target.name
        queue = self.queues.setdefault(name, deque())
        running = self.current.get(name)
        if (running is not None and running.key == job.key) or any(j.key == job.key for j in queue):
            log.info(
                "action merged with one already queued", extra={"action": job.action.name, "target": name}
            )
            if job.done is not None and not job.done.done():
                job.done.set_result(
                    {"outcome": "merged", "reason": "the same action is already queued or running"}
                )
            return 0
        if len(queue) >= MAX_QUEUED:
            reason = f"{QUEUE_RAIL}: {len(queue)} actions already wait for {name} (at most {MAX_QUEUED})"
            result = self.skip(job, Verdict(False, reason, QUEUE_RAIL))
            if job.done is not None and not job.done.done():
                job.done.set_result(result)
            return 0
        queue.append(job)
        worker = self.workers.get(name)
        if worker is None or worker.done():
            self.workers[name] = asyncio.get_running_loop().create_task(
                self._work(name), name=f"actions:{name}"
            )
        return 1

    async def _work(self, target: str) -> None:
        await self.ready.wait()
        queue = self.queues[target]
        while queue:
            job = queue.popleft()
            self.current[target] = job
            try:
                result = await self.run(job)
            except Exception as exc:  # one broken job must not kill the worker
                log.exception("action crashed", extra={"action": job.action.name, "target": target})
                result = {"outcome": "failed", "reason": f"internal error: {exc}"}
            finally:
                self.current.pop(target, None)
            if job.done is not None and not job.done.done():
                job.done.set_result(result)
        if self.queues.get(target) is queue:  # idle: a target that discovery dropped leaves nothing behind
            del self.queues[target]

    def drop(self, target: str) -> list[Job]:
        """Take every job waiting for `target` off its queue (the one running goes on); they are returned."""
        queue = self.queues.get(target)
        if queue is None:
            return []
        jobs = list(queue)
        queue.clear()  # in place: the worker holds this very queue
        return jobs

    async def finished(self, target: str) -> None:
        """Wait until `target`'s worker has no job left (never cancels it, even if this wait is cancelled)."""
        worker = self.workers.get(target)
        if worker is not None and not worker.done():
            await asyncio.wait({worker})

    async def aclose(self) -> None:
        """Cancel workers; an action cut short stays "running" in the log and is reconciled at next start."""
        tasks = [t for t in self.workers.values() if not t.done()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=3.0)
