"""Tenants: the organisations that own keys, usage and budgets."""
