"""`vllm-watchdog test-rules`: promtool's rule unit tests (test files, series notation, the runner)."""
