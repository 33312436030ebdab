"""Integrations with other software: gunicorn server hooks."""
