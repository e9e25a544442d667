"""Sub-commands that read what the daemon recorded: replay, plot, top."""
