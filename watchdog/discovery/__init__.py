"""Targets found, not listed: file_sd files and labelled Docker containers become targets."""
