"""Notifiers: Alertmanager API v2 and webhooks, fed from a bounded, persisted delivery queue."""
