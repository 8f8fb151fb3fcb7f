"""Kiln control plane and API gateway."""
