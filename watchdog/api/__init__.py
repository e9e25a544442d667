"""The watchdog's own HTTP API: the app, the action/control routes, bounded JSON bodies."""
