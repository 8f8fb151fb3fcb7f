"""Admission: one object per request that enters its quotas, holds its worst-case cost, carries
its priority and deadline through dispatch and streaming, and leaves once (usage recorded,
lease and hold released) however the request ends.

``services`` is the object and the per-process desk that opens one per request; ``deps`` the
Litestar dependencies that enter it after authentication; ``middleware`` the ASGI wrapper that
holds the response to the admission's deadline and leaves it when the response is over.
"""
