"""Remediation actions: runtimes that relaunch vLLM, the rails that limit them, and their state."""
