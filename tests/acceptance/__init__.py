"""Acceptance tier: `punctual dev` started as a user would, and the README run as written."""
