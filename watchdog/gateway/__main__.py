"""`python -m vllm_watchdog.gateway`: the gateway process (started by the daemon, systemd or compose)."""

from __future__ import annotations

import sys

from .dataplane.main import main

sys.exit(main())
