"""Metering and billing: the usage ledger."""
