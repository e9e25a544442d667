"""`fleet`: every member of this watchdog's fleet group, with its targets, firing alerts and actions, read
from etcd (no running watchdog needed)."""

from __future__ import annotations

import asyncio
from typing import TextIO

from ..config.model import Config
from ..fleet.etcd import EtcdClient, EtcdError
from ..fleet.members import format_members, read_members


async def _read(config: Config) -> list[dict[str, object]]:
    assert config.fleet is not None
    fleet = config.fleet
    client = EtcdClient(fleet.endpoints, fleet.http, fleet.request_timeout)
    try:
        return await read_members(client, f"{fleet.prefix}/{fleet.group}/".encode())
    finally:
        await client.aclose()


def print_fleet(config: Config, out: TextIO, err: TextIO) -> bool:
    """Print the group's members; False (and why, on `err`) when etcd could not be read."""
    assert config.fleet is not None
    try:
        members = asyncio.run(_read(config))
    except EtcdError as exc:
        err.write(f"vllm-watchdog fleet: {exc}\n")
        return False
    out.write(format_members(config.fleet.group, members))
    return True
