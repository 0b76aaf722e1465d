"""Defaults shared by the daemon and the CLI, kept import-light for fast commands."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8742
DEFAULT_INTERVAL_S = 15.0
