"""Idempotency-Key on POSTs of ``/v1`` and ``/admin/v1``: claim, run once, store, replay."""
