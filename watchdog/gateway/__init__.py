"""The admission gateway: an OpenAI-compatible pass-through in front of one vLLM target.

Three packages: `dataplane/` (the gateway process), `control/` (the daemon's side) and `protocol/` (what both
share). `config.py` is the gateway's section of the config file; `routes.py` is vLLM's route table.
"""
