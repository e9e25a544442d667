"""The action state database: the audit log, launch specs, drains, silences, the pause switch."""

from __future__ import annotations
