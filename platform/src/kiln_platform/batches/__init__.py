"""OpenAI-compatible Files and Batches: tenants' JSONL files, batches run on Kiln's own fleet."""
