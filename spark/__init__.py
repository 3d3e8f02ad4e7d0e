"""Spark on the unified stream."""
