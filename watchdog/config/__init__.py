"""The watchdog's configuration: the model, includes, YAML nodes with positions, durations, file reads.

The model assembles the sections each stage owns: actions/config.py, gateway/config.py, notifiers/config.py.
"""
