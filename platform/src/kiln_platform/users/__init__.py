"""Users context."""
