"""The request's structured-output fields -> one StructuredOutputsParams, compiled before any work is queued.

The vocabularies: OpenAI's `response_format` (`text`, `json_object`, `json_schema` with `strict`), vLLM's
`structured_outputs` object (StructuredOutputsParams' fields) and its older `guided_json`, `guided_regex`,
`guided_choice`, `guided_grammar` (with `guided_whitespace_pattern`, `guided_decoding_backend`). One request sets one
of them; a forced tool call (server/tools.py) is a grammar too. An invalid schema, regex or grammar is a 400 that
names the request's field and gives llguidance's reason.
"""
from __future__ import annotations

from samebits.server.errors import invalid
from samebits.structured.grammar import GrammarError
from samebits.structured.params import StructuredOutputsParams

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
# guided_decoding_backend values that name samebits' one backend (vLLM's "auto" and its llguidance name).
BACKENDS = ("auto", "guidance", "llguidance")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def _refuse_extra(obj, where: str, param: str) -> None:
    for name in obj.model_extra or {}:
        raise invalid(f"{where}.{name} is not a field samebits knows; leave it out", param)


def _response_format(rf) -> StructuredOutputsParams | None:
    _refuse_extra(rf, "response_format", "response_format")
    if rf.type not in RESPONSE_FORMATS:
        raise invalid(f"response_format.type must be one of {', '.join(RESPONSE_FORMATS)}, got {rf.type!r}",
                      "response_format")
    if rf.type == "text":
        return None
    if rf.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    js = rf.json_schema
    if js is None or js.schema_ is None:
        raise invalid("response_format.json_schema.schema is required when type is json_schema", "response_format")
    _refuse_extra(js, "response_format.json_schema", "response_format")
    # OpenAI's strict mode: objects hold their listed properties only.
    return _params("response_format", "structured_outputs.json", "response_format.json_schema.schema",
                   json=js.schema_, disable_additional_properties=bool(js.strict))


def _params(param: str, theirs: str, ours: str, **values) -> StructuredOutputsParams:
    """StructuredOutputsParams(**values); its error, which names its own field `theirs`, names `ours` in the 400."""
    try:
        return StructuredOutputsParams(**values)
    except (TypeError, ValueError) as e:
        message = str(e).replace("StructuredOutputsParams:", "structured_outputs:")
        raise invalid(message.replace(theirs, ours), param) from None


def _guided(req) -> tuple[StructuredOutputsParams, str] | None:
    given = [name for name in GUIDED if getattr(req, name) is not None]
    backend = req.guided_decoding_backend
    if backend is not None and backend not in BACKENDS:
        raise invalid(f"guided_decoding_backend must be one of {', '.join(BACKENDS)} (samebits' backend is "
                      f"llguidance), got {backend!r}", "guided_decoding_backend")
    if not given:
        if req.guided_whitespace_pattern is not None:
            raise invalid("guided_whitespace_pattern needs guided_json", "guided_whitespace_pattern")
        return None
    name = given[0]
    if len(given) > 1:
        raise invalid(f"set one of {', '.join(GUIDED)}; got {', '.join(given)}", given[1])
    kind = GUIDED[name]
    if req.guided_whitespace_pattern is not None and kind != "json":
        raise invalid("guided_whitespace_pattern applies to guided_json only", "guided_whitespace_pattern")
    return _params(name, f"structured_outputs.{kind}", name, **{kind: getattr(req, name)},
                   whitespace_pattern=req.guided_whitespace_pattern), name


def constraint(req, forced: tuple[StructuredOutputsParams, str] | None = None):
    """(the request's constraint, the field that set it), or (None, None); a 400 when two fields set one. `forced` is
    a tool call's grammar and the field that forces it (tool_choice)."""
    found = []
    if req.response_format is not None:
        so = _response_format(req.response_format)
        if so is not None:
            found.append((so, "response_format"))
    if req.structured_outputs is not None:
        found.append((_params("structured_outputs", "", "", **req.structured_outputs), "structured_outputs"))
    guided = _guided(req)
    if guided is not None:
        found.append(guided)
    if forced is not None:
        found.append(forced)
    if len(found) > 1:
        raise invalid(f"{found[0][1]} and {found[1][1]} both constrain the output; send one", found[1][1])
    return found[0] if found else (None, None)


def compiled(state, so: StructuredOutputsParams | None, field: str | None) -> None:
    """Compile the constraint with the server's vocabulary now: a 400 naming `field` and llguidance's reason."""
    if so is None:
        return
    try:
        state.grammars.compile(so)
    except GrammarError as e:
        raise invalid(f"{_where(field, e.kind)} is not valid: {e.reason}", field) from None


def _where(field: str, kind: str) -> str:
    if field == "response_format":
        return "response_format.json_schema.schema" if kind == "json" else "response_format"
    if field == "structured_outputs":
        return f"structured_outputs.{kind}"
    return field
