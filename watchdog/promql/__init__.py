"""Embedded PromQL: selectors now; the evaluator arrives with the rule engine."""
