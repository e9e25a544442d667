"""The exit statuses of every `vllm-watchdog` command, in one place (docs/configuration.md lists them).

As promtool and amtool: 0 success, 1 the command ran and found problems; 2 is argparse's own usage error;
promtool's lint failure is 3, here any invalid config or rule file.

0 OK           done; every target up, every test passed, the config valid
1 FAILED       ran and the answer is no: a target down, a rule test failed, a query could not be evaluated,
               `init` would overwrite a file, `run` could not listen
2 USAGE        the command line is wrong (unknown flag, missing argument, a flag value that does not parse)
3 CONFIG       the config, an included file or a rule file is invalid (every problem printed as file:line);
               also a reload the daemon rejected
4 UNREACHABLE  the daemon's API (`top --once`, `reload`), every target of `query`, or the rule_backend
               could not be reached

Not yet here: `vllm-watchdog gateway` keeps the codes its supervisor reads (gateway/protocol/spec.py): 2 for
an invalid config or spec, 3 when it cannot listen.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_UNREACHABLE = 4
