"""The watchdog's configuration: the model, includes, YAML nodes with positions, durations, file reads."""
