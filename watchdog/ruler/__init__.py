"""Rule evaluation: rule files, the alerting rule state machine, groups, their persisted state."""
