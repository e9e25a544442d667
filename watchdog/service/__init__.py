"""The daemon process: wiring of the stages, systemd notify, own metrics, clock and fd limits."""
