"""LoRA adapters of a tenant: upload, list, delete; the gateway finds them by name."""
