"""Items as the Responses and Conversations APIs list them, and their pages."""

from __future__ import annotations

from typing import Any

from kiln_platform.errors import NotFound


def with_parts(item: dict[str, Any]) -> dict[str, Any]:
    """A message item's text as a content part (``output_text`` for the assistant's,
    ``input_text`` else); any other item as it is."""
    if item.get("type", "message") == "message" and isinstance(item.get("content"), str):
        part = "output_text" if item.get("role") == "assistant" else "input_text"
        return {**item, "content": [{"type": part, "text": item["content"]}]}
    return item


def text_of(content: Any) -> str:
    """A message's text: its ``content`` string, or its content parts' texts joined."""
    if isinstance(content, list):
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return content or ""


def page(items: list[dict[str, Any]], after: str | None, limit: int, of: str) -> dict[str, Any]:
    """A list object of up to ``limit`` items after the one whose id is ``after`` (a 404 if
    none of ``of``, what holds them, has that id)."""
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise NotFound(f"'after' names no item of {of}.", param="after")
        items = items[ids.index(after) + 1 :]
    shown = items[:limit]
    return {
        "object": "list", "data": shown, "has_more": len(items) > limit,
        "first_id": shown[0]["id"] if shown else None,
        "last_id": shown[-1]["id"] if shown else None,
    }  # fmt: skip
