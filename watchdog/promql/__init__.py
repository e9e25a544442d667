"""Embedded PromQL: expressions compiled once, the evaluator over the sample store, its functions, and the
remote Prometheus-compatible backend that can stand in for it."""
