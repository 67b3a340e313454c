"""Punctual: a distributed job scheduler.

`celery -A app ...` finds the Celery application in app/celery.py; nothing heavy is
imported here so that `punctual --help` and the SDK stay quick.
"""

__version__ = "0.1.0"
