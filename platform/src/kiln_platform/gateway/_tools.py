"""Tool calls (OpenAI's ``tools``), model-agnostic: the structured-output grammar holds the
answer to a call and its text becomes ``tool_calls``.

``tool_choice: "required"`` writes a JSON list of ``{"name", "parameters"}`` (one item unless
``parallel_tool_calls``), each function's ``parameters`` schema enforced; a named function
writes that function's arguments alone; ``"none"`` ignores the tools. ``"auto"`` (OpenAI's
default when tools are given) lets the model choose: text, or calls in the format its chat
template teaches (``_call_formats``: Hermes', Qwen3-Coder's XML, Llama 3's JSON, Mistral's;
in the tagged ones words may come first), each held to its function's schema. A reasoning
model reasons first, freely, and then answers so (``_structured.after_thought``; its
reasoning is the message's). The tools are passed to the chat template (``tools``), as
Hugging Face's ``apply_chat_template`` does; for a template that does not show them,
``"auto"`` shows them, and Hermes' format, in a system message (``brief``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._call_formats import HERMES, CallFormat, schemas
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, FunctionCall, ToolCall

if TYPE_CHECKING:
    from kiln_platform.gateway._textmodel import TextModel
    from kiln_platform.gateway.llm_schemas import CompletionRequest

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
"""A function's ``parameters`` when it gives none (OpenAI's: an empty parameter list)."""
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_COMPOSED = ("allOf", "anyOf", "oneOf", "if", "not", "dependentSchemas")
BRIEF = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{tools}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""


@dataclass(frozen=True, slots=True)
class ToolPlan:
    """The functions a request offers and how the model must call them."""

    functions: dict[str, dict[str, Any]]
    """Name -> ``parameters`` schema."""
    named: str | None
    """The function ``tool_choice`` names (its arguments are the whole answer), else ``None``."""
    parallel: bool
    auto: bool = False
    """The model chooses between text and calls (``tool_choice: "auto"``)."""
    format: CallFormat = HERMES
    """How the model writes the calls it chooses (``written``)."""

    def written(self, call_format: CallFormat) -> ToolPlan:
        """The plan for a model whose template teaches ``call_format``."""
        return replace(self, format=call_format.bound(self.functions))

    @property
    def finish_reason(self) -> str:
        """OpenAI's: ``tool_calls`` when the model chose, ``stop`` for a named function."""
        return "stop" if self.named else "tool_calls"

    def schema(self) -> dict[str, Any]:
        """The JSON schema the answer is held to."""
        if self.named is not None:
            return self.functions[self.named]
        calls = schemas(self.functions, "parameters")
        items = calls[0] if len(calls) == 1 else {"anyOf": calls}
        return {"type": "array", "items": items, "minItems": 1} | (
            {} if self.parallel else {"maxItems": 1}
        )

    def constraint(self, answer: dict[str, Any] | None = None) -> tuple[str, Any]:
        """The structured output the answer follows, as (kind, value): the calls' JSON schema,
        or, for ``auto``, a Lark grammar of text (or JSON following ``answer``, a schema) or
        calls in the model's format."""
        if not self.auto:
            return "json", self.schema()
        return "grammar", self.format.grammar(self.functions, answer, self.parallel)

    def sendable(self, held: str, sent: bool) -> int:
        """How much of what is held of an answer (after what was ``sent``) may be streamed as
        its words: none unless ``auto``; past that, what surely opens no call."""
        return self.format.sendable(held, sent) if self.auto else 0

    def preface(self, text: str) -> str:
        """The words an answer with calls wrote before them."""
        return self.format.preface(text) if self.auto else ""

    def calls(self, text: str, call_id: str) -> list[ToolCall] | None:
        """The answer as tool calls (``None`` if it is text, or calls cut by ``max_tokens``)."""
        try:
            if self.auto:
                said = self.format.called(text)
                pairs = self.format.read(text, self.functions) if said else []
            elif self.named:
                pairs = [(self.named, json.loads(text))]
            else:
                pairs = [(call["name"], call["parameters"]) for call in json.loads(text)]
        except (ValueError, KeyError, TypeError):
            return None
        return [
            ToolCall(id=f"{call_id}_{i}", function=FunctionCall(name=n, arguments=json.dumps(a)))
            for i, (n, a) in enumerate(pairs)
        ] or None


def _functions(tools: list[Any]) -> dict[str, dict[str, Any]]:
    functions: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        spec = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(spec, dict) or tool.get("type") != "function":
            raise BadRequest(
                f"'tools[{i}]' must be {{'type': 'function', 'function': {{...}}}}.",
                param=f"tools[{i}]",
            )
        name, params = spec.get("name"), spec.get("parameters")
        params = NO_ARGUMENTS if params is None else params  # left out or null (the SDKs' None)
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in functions:
            raise BadRequest(
                f"'tools[{i}].function.name' must be a unique name of 1-64 letters, digits, "
                "'_' or '-'.",
                param=f"tools[{i}].function.name",
            )
        if not isinstance(params, dict):
            raise BadRequest(
                f"'tools[{i}].function.parameters' must be a JSON schema object.",
                param=f"tools[{i}].function.parameters",
            )
        functions[name] = closed(params)
    return functions


def closed(schema: Any) -> Any:
    """``schema`` with every object that lists its ``properties`` and says nothing of others
    closed to them (``additionalProperties: false``), as xgrammar's strict mode holds a call's
    arguments: a function gets only the arguments it declares. An
    object composed with others (``allOf``, ``anyOf`` beside its properties...) stays as
    written: closing its parts would refuse each other's properties."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: closed(sub) for name, sub in out[key].items()}
    for key in ("items", "additionalProperties"):
        if isinstance(out.get(key), dict):
            out[key] = closed(out[key])
    if isinstance(out.get("prefixItems"), list):
        out["prefixItems"] = [closed(sub) for sub in out["prefixItems"]]
    composed = any(key in out for key in _COMPOSED)
    if "properties" not in out:  # alternatives of whole objects: each closed alone
        for key in ("anyOf", "oneOf"):
            if isinstance(out.get(key), list):
                out[key] = [closed(sub) for sub in out[key]]
    elif not composed and not {"additionalProperties", "unevaluatedProperties"} & out.keys():
        out["additionalProperties"] = False
    return out


def plan(tools: list[Any] | None, choice: Any, parallel: bool | None) -> ToolPlan | None:
    """How the request calls its tools (``None``: it answers in text), or a 400 naming why not."""
    if not tools:
        if choice not in (None, "none", "auto"):
            raise BadRequest("'tool_choice' needs 'tools'.", param="tool_choice")
        return None
    functions = _functions(tools)
    if choice == "none":
        return None
    if choice in (None, "auto"):
        return ToolPlan(functions, None, parallel is not False, auto=True)
    named = None
    if choice != "required":
        spec = choice.get("function") if isinstance(choice, dict) else None
        named = spec.get("name") if isinstance(spec, dict) else None
        if named not in functions:
            raise BadRequest(
                "'tool_choice' must be 'none', 'auto', 'required' or {'type': 'function', "
                "'function': {'name': <one of the tools>}}.",
                param="tool_choice",
            )
    return ToolPlan(functions, named, parallel is not False)


def requested(
    request: ChatCompletionRequest | CompletionRequest, model: TextModel
) -> ToolPlan | None:
    """The plan of a chat's tools, its calls written as the model's (tool-use) template
    teaches."""
    if not isinstance(request, ChatCompletionRequest):
        return None
    made = plan(request.tools, request.tool_choice, request.parallel_tool_calls)
    return made and made.written((model.tool_use or model).calls)


def marked(tools: ToolPlan | None, model: TextModel) -> bool:
    """Whether a chat's text keeps special tokens (``skip_special_tokens`` off): those of
    harmony's channels, or of the calls the model may choose (``CallFormat.marked``)."""
    return model.harmony is not None or bool(tools and tools.auto and tools.format.marked)


def brief(tools: list[dict[str, Any]]) -> str:
    """The system text that shows ``tools`` and the Hermes call format to a model whose chat
    template does not (the words of Qwen2.5's template)."""
    return BRIEF.format(tools="\n".join(json.dumps(tool) for tool in tools))
