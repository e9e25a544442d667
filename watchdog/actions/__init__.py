"""Remediation actions, one sub-package per concern: kinds/ (what each action kind is and does), pipeline/
(routes, rails, gates, plans, flows, the remediator), runtimes/ (what reaches vLLM), store/ (the action state
database and its audit log) and incidents/ (the evidence before a disruptive action). service/ wires them."""

from __future__ import annotations

from . import kinds  # noqa: F401  (registers every action kind before any config is parsed)
