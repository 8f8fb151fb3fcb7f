"""Audit context."""
