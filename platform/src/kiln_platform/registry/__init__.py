"""Model registry: models, immutable versions, their artifacts."""
