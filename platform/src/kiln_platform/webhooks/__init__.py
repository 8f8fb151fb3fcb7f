"""Outbound webhooks of tenants: endpoints, the outbox of deliveries, the delivery loop."""
