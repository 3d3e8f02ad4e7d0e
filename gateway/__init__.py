"""The Magnetar process: configuration, CLI, listeners, admin and metrics."""

__version__ = "0.1.0"
