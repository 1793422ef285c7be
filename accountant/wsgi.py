"""The WSGI entry point: ``gunicorn accountant.wsgi:app``."""

from __future__ import annotations

from accountant.app import create_app

app = create_app()
