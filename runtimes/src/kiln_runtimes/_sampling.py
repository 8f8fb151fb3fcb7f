"""The SDK side of ``tracing.server``'s sampling decision (imported once tracing is on)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.trace import SpanKind

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.util.types import Attributes


class SettableIds(RandomIdGenerator):
    """Random ids, except that the next trace id can be set: the one ``tracing.server`` already
    asked the sampler about, so the sampled root span keeps it (the SDK would draw another and
    sample again). Server spans are made on the event loop's one thread, the id set and taken
    in one synchronous call."""

    next_trace_id = 0

    def generate_trace_id(self) -> int:
        chosen, self.next_trace_id = self.next_trace_id, 0
        return chosen or super().generate_trace_id()


def records(
    provider: TracerProvider, parent: Context | None, trace_id: int, name: str,
    attributes: Attributes | None,
) -> bool:  # fmt: skip
    """Whether ``provider``'s sampler would record a server span of ``trace_id``."""
    result = provider.sampler.should_sample(parent, trace_id, name, SpanKind.SERVER, attributes)
    return result.decision is not Decision.DROP
