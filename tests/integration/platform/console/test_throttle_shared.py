"""The sign-in throttle counts in PostgreSQL: failures counted by different gateway processes add
up, and the window slides on the database's clock."""

from __future__ import annotations

import uuid

from sqlalchemy import text

from kiln_platform.users.throttle import Attempt, SignInThrottle

from .conftest import PASSWORD, App, csrf


async def test_failures_through_two_throttles_add_up(app: App) -> None:
    """Two gateway processes each have their own ``SignInThrottle``; the count is the database's."""
    email = await app.user("tenant-admin", await app.tenant())
    first, second, sessions = SignInThrottle(5), SignInThrottle(5), app.kiln.db.sessions
    for throttle in (first, second, first, second):
        await throttle.failed(sessions, email, "10.1.1.1")
    assert await first.retry_after(sessions, email, "10.2.2.2") == 0.0  # 4 of 5
    async with app.client() as http:  # the gateway's own throttle counts the fifth
        token = csrf(await http.get("/console/login"))
        form = {"email": email, "password": "guess", "_csrf_token": token}
        assert (await http.post("/console/login", data=form)).status_code == 401
        form["password"] = PASSWORD
        assert (await http.post("/console/login", data=form)).status_code == 429
    assert await second.retry_after(sessions, email, "10.3.3.3") > 800


async def test_the_window_slides_on_the_database_clock(app: App) -> None:
    throttle, sessions = SignInThrottle(5), app.kiln.db.sessions
    email, source = f"w-{uuid.uuid4().hex[:6]}@example.com", f"10.9.{uuid.uuid4().int % 250}.1"

    async def failures_ago(minutes: float, n: int) -> None:
        async with sessions.begin() as session:
            for _ in range(n):
                await session.execute(
                    text("INSERT INTO signin_failures (key, failed_at) "
                         "VALUES (:k, now() - make_interval(secs => :s))"),
                    {"k": f"email:{email}", "s": minutes * 60},
                )  # fmt: skip

    await failures_ago(15.5, 5)  # left the window
    assert await throttle.retry_after(sessions, email, source) == 0.0
    await failures_ago(14.5, 4)
    assert await throttle.retry_after(sessions, email, source) == 0.0  # 4 < 5
    await throttle.failed(sessions, email.upper(), source)  # the fifth: locked
    wait = await throttle.retry_after(sessions, email, source)
    assert 25 < wait <= 30  # until the oldest of the last five leaves, 30 s from now
    await throttle.succeeded(sessions, email, Attempt(0.0))
    assert await throttle.retry_after(sessions, email, source) == 0.0
