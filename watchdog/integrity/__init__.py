"""Integrity: the known-answer probe, which catches a vLLM that answers wrong while its health says fine."""
