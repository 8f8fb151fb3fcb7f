"""The `/v1` API gateway: authentication, validation, tokenization, dispatch to workers."""
