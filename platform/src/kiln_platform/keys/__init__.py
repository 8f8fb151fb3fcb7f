"""API keys: shown once, stored as keyed hashes, verified through a revocation-aware cache."""
