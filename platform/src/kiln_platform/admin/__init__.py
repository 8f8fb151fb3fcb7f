"""The admin API: who may do what (``authz``), tenants and keys (``services``), HTTP handlers."""
