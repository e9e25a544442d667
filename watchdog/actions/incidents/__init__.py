"""Incident bundles: the evidence collected, within a time budget, before a disruptive action stops vLLM."""
