"""OAuth2 client credentials: clients, RFC 9068 JWT access tokens, JWKS, introspection."""
