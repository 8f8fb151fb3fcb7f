"""Quotas context."""
