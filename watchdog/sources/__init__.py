"""Sources: the places samples come from (vLLM, health probes, GPUs)."""
