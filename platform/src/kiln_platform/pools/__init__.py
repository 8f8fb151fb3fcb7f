"""Runtime pools: one per model version; backends that run their workers."""
