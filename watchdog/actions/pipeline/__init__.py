"""The decision pipeline: routes, rails and gates, plans and flows, the job queues and the remediator."""

from __future__ import annotations
