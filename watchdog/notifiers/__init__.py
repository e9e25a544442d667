"""Notifiers: the alert they send, their config section, Alertmanager API v2 and webhooks, fed from a bounded,
persisted delivery queue."""
