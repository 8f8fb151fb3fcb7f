"""Finance reports: cost reports over the priced ledger (``usage_charges``), monthly statements
that close immutably, and adjustments (corrections as separate charge lines)."""
