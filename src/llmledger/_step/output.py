"""Structured outputs: a step's output schema, what the API is sent, how an answer is checked and stored.

`apply_llm(..., output=Model)` takes a pydantic model, or a mapping of field
names to types (`{"company": str, "year": int | None, "tone": Literal["a", "b"]}`),
which becomes one. The request asks for JSON matching the model's JSON schema
through the Messages API's structured outputs
(`output_config={"format": {"type": "json_schema", "schema": ...}}`), so the
schema is part of the request and of its fingerprint: changing it makes the
step's answers stale.

The schema is rewritten the way the API accepts it (every object closed with
`additionalProperties: false`; keywords it does not enforce, such as
`minLength`, moved into the description) and mapped to a DuckDB type: objects
become STRUCTs, arrays lists, enums and `Literal`s VARCHAR, so plain SQL reads
`extract.company`. Every answer is checked against the schema it was sent
with (`check`), which the stored request carries, so `resume` checks answers
the same way without the Python model; the pydantic model, when there is one,
also runs its own validators.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmledger._step.sqltext import q
from llmledger.errors import InvalidInputError

_SCALARS = {"string": "VARCHAR", "integer": "BIGINT", "number": "DOUBLE", "boolean": "BOOLEAN"}
_STRING_FORMATS = {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
_INT64 = (-(2**63), 2**63 - 1)


class OutputError(ValueError):
    """An answer that does not match the step's output schema (the message says where and why)."""


@dataclass(frozen=True)
class OutputSpec:
    """A step's structured output: the schema sent to the API, its DuckDB type, and the pydantic model if any."""

    schema: dict[str, Any]
    model: Any = None  # a pydantic BaseModel subclass; None when rebuilt from a stored request

    @property
    def sql_type(self) -> str:
        return sql_type(self.schema, self.schema.get("$defs", {}))

    def request_option(self) -> dict[str, Any]:
        """The Messages API's `output_config`."""
        return {"format": {"type": "json_schema", "schema": self.schema}}

    def response_format(self) -> dict[str, Any]:
        """Chat Completions' `response_format`: the same schema, strict (every object closed, every field required,
        as `api_schema` writes it), so the answer matches it or is a refusal."""
        return {"type": "json_schema", "json_schema": {"name": "answer", "strict": True, "schema": self.schema}}

    def check(self, text: str) -> str:
        """The answer as normalised JSON (every property present), or OutputError saying what is wrong."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise OutputError(f"the answer is not valid JSON ({exc.msg} at character {exc.pos})") from None
        value = normalise(_without_nul(value), self.schema, self.schema.get("$defs", {}), "$")
        if self.model is not None:
            try:
                self.model.model_validate(value)
            except Exception as exc:  # pydantic.ValidationError, or an error raised by a user's validator
                raise OutputError(f"the answer does not validate as {self.model.__name__}: {exc}") from None
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    # Every field is required in the schema sent (api_schema), so the answer has them all and a model's
    # defaults never come into play: apply_llm and resume see the same value.

    def value(self, normalised: str) -> Any:
        """What a `validate=` callable sees: the pydantic instance, or the parsed JSON."""
        data = json.loads(normalised)
        return self.model.model_validate(data) if self.model is not None else data


def _without_nul(value: Any) -> Any:
    """The parsed answer with every NUL character (JSON's "\\u0000") replaced by U+FFFD: PostgreSQL stores no
    NUL, and a paid answer must not be lost over one character."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    return value


def output_spec(output: Any) -> OutputSpec | None:
    """Check `output=` and turn it into an OutputSpec (None for free-text answers)."""
    if output is None:
        return None
    try:
        import pydantic
    except ImportError:  # pragma: no cover - pydantic is a dependency
        raise InvalidInputError("output= needs pydantic (pip install pydantic)") from None
    model = output
    if isinstance(output, Mapping):
        if not output:
            raise InvalidInputError("output= is an empty mapping; name at least one field, e.g. {'company': str}")
        bad = [name for name in output if not isinstance(name, str) or not name.isidentifier()]
        if bad:
            raise InvalidInputError(
                f"output= field names must be identifiers (letters, digits, underscores), got {bad}"
            )
        for name, tp in output.items():
            _check_field_type(name, tp)
        try:
            fields: dict[str, Any] = {name: (tp, ...) for name, tp in output.items()}
            model = pydantic.create_model("Output", **fields)
        except Exception as exc:
            raise InvalidInputError(
                f"output= could not be made into a model: {exc}. Use types such as str, int, "
                "float, bool, Literal['a', 'b'], list[str], T | None or a pydantic model."
            ) from None
    elif not (isinstance(output, type) and issubclass(output, pydantic.BaseModel)):
        raise InvalidInputError(
            f"output= must be a pydantic model class or a mapping of field names to types "
            f"such as {{'company': str, 'year': int}}, got {output!r}"
        )
    try:
        raw = model.model_json_schema()
    except Exception as exc:
        raise InvalidInputError(f"output= {model.__name__} has no JSON schema: {exc}") from None
    schema = api_schema(raw)
    if schema.get("type") != "object":
        raise InvalidInputError(f"output= must describe an object (a model with fields), got {raw!r}")
    _check_typed(schema, schema.get("$defs", {}), "output")
    try:
        sql_type(schema, schema.get("$defs", {}))
    except RecursionError:
        raise InvalidInputError(
            f"output= {model.__name__} refers to itself; a stored column cannot nest without end. Flatten the model."
        ) from None
    return OutputSpec(schema, model)


_POLARS_TYPES = {
    "Boolean": "bool",
    "String": "str",
    "Utf8": "str",
    "Date": "datetime.date",
    "Datetime": "datetime.datetime",
    "Categorical": "str",
    "Enum": "Literal['a', 'b']",
}


_TYPE_WORDS = {"string": "str", "str": "str", "integer": "int", "int": "int", "number": "float", "float": "float",
               "boolean": "bool", "bool": "bool", "array": "list[str]", "list": "list[str]"}  # fmt: skip


def _check_field_type(name: str, tp: Any) -> None:
    """Refuse a polars dtype where a Python type belongs (`{"spam": pl.Boolean}`), or a type's name as a string
    (`{"x": "string"}`: JSON Schema's word, or a forward reference pydantic cannot resolve), naming the one to use."""
    if isinstance(tp, str):
        python = _TYPE_WORDS.get(tp.strip().lower(), "str")
        raise InvalidInputError(
            f"output= field {name!r} is the string {tp!r}; output= takes Python types, not their names: "
            f"{{{name!r}: {python}}}, or int, float, bool, datetime.date, Literal['a', 'b'], list[str], T | None "
            "or a pydantic model"
        )
    module = getattr(tp if isinstance(tp, type) else type(tp), "__module__", "") or ""
    if not module.startswith("polars"):
        return
    kind = getattr(tp, "__name__", None) or type(tp).__name__
    python = _POLARS_TYPES.get(kind) or (
        "int"
        if kind.startswith(("Int", "UInt"))
        else "float"
        if kind.startswith(("Float", "Decimal"))
        else "list[str]"
        if kind in ("List", "Array")
        else "str"
    )
    raise InvalidInputError(
        f"output= field {name!r} is the polars type {tp!r}; output= takes Python types: str, "
        f"int, float, bool, datetime.date, Literal['a', 'b'], list[str], T | None or a "
        f"pydantic model. Use {python} (the stored column is then {kind})."
    )


def _check_typed(schema: dict[str, Any], defs: dict[str, Any], path: str) -> None:
    """Every value the answer holds must have a type the API can constrain: refuse, naming the field and the fix,
    what would make the API answer every row with a 400 (a bare `list`, `set` or `tuple`, `Any`, `object`)."""
    schema = resolved(schema, defs)
    if "anyOf" in schema or "allOf" in schema:
        for sub in schema.get("anyOf", []) + schema.get("allOf", []):
            _check_typed(sub, defs, path)
        return
    if "enum" in schema or "const" in schema:
        return
    kind = schema.get("type")
    if kind is None:
        raise InvalidInputError(
            f"output= field {path!r} may hold anything (Any or object), which structured "
            "outputs cannot constrain; give it a type such as str, int, list[str] or a model"
        )
    if kind == "array":
        items = schema.get("items")
        if not items:
            tuple_like = "prefixItems" in (schema.get("description") or "")
            raise InvalidInputError(
                f"output= field {path!r} is "
                + (
                    "a tuple, which structured outputs do not support; use a model with named fields, or list[T]"
                    if tuple_like
                    else "a list of anything (a bare list, set or tuple); say what it holds, e.g. list[str]"
                )
            )
        _check_typed(items, defs, path + "[]")
    elif kind == "object":
        for name, sub in schema.get("properties", {}).items():
            _check_typed(sub, defs, name if path == "output" else f"{path}.{name}")


def spec_from_request(options: Mapping[str, Any]) -> OutputSpec | None:
    """The output spec recorded in a stored request's `output_config` (or Chat Completions' `response_format`, or
    Responses' `text.format`), if it asks for JSON."""
    config = options.get("output_config") or options.get("text")
    fmt = config.get("format") if isinstance(config, Mapping) else None
    chat = options.get("response_format")
    if isinstance(chat, Mapping) and chat.get("type") == "json_schema" and isinstance(chat.get("json_schema"), Mapping):
        fmt = {"type": "json_schema", "schema": chat["json_schema"].get("schema")}
    if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema" and isinstance(fmt.get("schema"), dict):
        return OutputSpec(_in_field_order(fmt["schema"]))
    return None


def _in_field_order(schema: Any) -> Any:
    """A stored schema with each object's properties back in their declared order. The stored request is canonical
    JSON (keys sorted), but `required` lists every field in order (`api_schema`): without this a store rebuilt
    the Struct as {reason, spam} where the model said {spam, reason} (PostgreSQL's JSONB answers, a copy)."""
    if isinstance(schema, list):
        return [_in_field_order(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: _in_field_order(value) for key, value in schema.items()}
    properties, order = out.get("properties"), out.get("required")
    if isinstance(properties, dict) and isinstance(order, list) and set(order) == set(properties):
        out["properties"] = {name: properties[name] for name in order}
    return out


# -- the schema the API accepts ------------------------------------------------------------------------


def api_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` as structured outputs accept it: objects closed, unsupported keywords moved to the description."""
    out: dict[str, Any] = {}
    rest = dict(schema)
    if "$defs" in rest:
        out["$defs"] = {name: api_schema(sub) for name, sub in rest.pop("$defs").items()}
    if "$ref" in rest:
        out["$ref"] = rest.pop("$ref")
        return out
    for name in ("anyOf", "oneOf", "allOf"):
        if name in rest:
            out["anyOf" if name == "oneOf" else name] = [api_schema(sub) for sub in rest.pop(name)]
    for name in ("type", "enum", "const", "title", "description"):
        if name in rest:
            out[name] = rest.pop(name)
    if out.get("type") == "object":
        properties = rest.pop("properties", {})
        extra = rest.pop("additionalProperties", None)
        if not properties or extra not in (None, False):
            raise InvalidInputError(
                f"output= has a mapping with free keys ({out.get('title') or 'a dict field'}); structured outputs "
                "fill named fields only. Use a model with named fields, or a list of key/value models."
            )
        lowered = [k.lower() for k in properties]
        if len(set(lowered)) < len(lowered):
            raise InvalidInputError(
                f"output= has fields differing only in case ({sorted(properties)}); SQL "
                "column names ignore case, so rename one"
            )
        out["properties"] = {k: api_schema(v) for k, v in properties.items()}
        rest.pop("required", None)
        out["required"] = list(properties)  # every field, always: the answer never relies on a default
        out["additionalProperties"] = False
    elif out.get("type") == "array" and "items" in rest:
        out["items"] = api_schema(rest.pop("items"))
    elif out.get("type") == "string" and rest.get("format") in _STRING_FORMATS:
        out["format"] = rest.pop("format")
    rest.pop("default", None)
    if rest:
        hint = "{" + ", ".join(f"{k}: {v}" for k, v in sorted(rest.items())) + "}"
        out["description"] = (out["description"] + "\n\n" if "description" in out else "") + hint
    return out


# -- the DuckDB type -----------------------------------------------------------------------------------


def resolved(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        found: dict[str, Any] = defs[ref.split("/", 2)[2]]
        return found
    return schema


def _not_null(schema: dict[str, Any]) -> list[dict[str, Any]]:
    return [s for s in schema.get("anyOf", []) if s.get("type") != "null"]


def sql_type(schema: dict[str, Any], defs: dict[str, Any]) -> str:
    """The DuckDB column type holding values of `schema` (JSON where no single type fits)."""
    schema = resolved(schema, defs)
    if "anyOf" in schema:
        variants = _not_null(schema)
        return sql_type(variants[0], defs) if len(variants) == 1 else "JSON"
    kind = schema.get("type")
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return "VARCHAR" if all(isinstance(v, str) for v in values) else "JSON"
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        return sql_type(schema.get("items", {}), defs) + "[]" if "items" in schema else "JSON"
    if kind == "object":
        props = schema.get("properties", {})
        if not props:
            return "JSON"
        return "STRUCT(" + ", ".join(f"{q(name)} {sql_type(sub, defs)}" for name, sub in props.items()) + ")"
    return "JSON"


# -- checking an answer --------------------------------------------------------------------------------


def normalise(value: Any, schema: dict[str, Any], defs: dict[str, Any], path: str) -> Any:
    """`value` checked against `schema`, with every object's properties present (missing optional ones null)."""
    schema = resolved(schema, defs)
    if "anyOf" in schema:
        problems = []
        for variant in schema["anyOf"]:
            try:
                return normalise(value, variant, defs, path)
            except OutputError as exc:
                problems.append(str(exc))
        raise OutputError(f"{path} matches none of the allowed forms ({'; '.join(problems)})")
    if "enum" in schema and value not in schema["enum"]:
        raise OutputError(f"{path} is {value!r}, not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        raise OutputError(f"{path} is {value!r}, not {schema['const']!r}")
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict):
            raise OutputError(f"{path} should be an object, got {json.dumps(value)[:80]}")
        props = schema.get("properties", {})
        extra = sorted(set(value) - set(props))
        if extra and schema.get("additionalProperties") is False:
            raise OutputError(f"{path} has unexpected field(s) {extra}")
        missing = [name for name in schema.get("required", []) if name not in value]
        if missing:
            raise OutputError(f"{path} is missing required field(s) {missing}")
        return {
            name: (normalise(value[name], sub, defs, f"{path}.{name}") if name in value else None)
            for name, sub in props.items()
        }
    if kind == "array":
        if not isinstance(value, list):
            raise OutputError(f"{path} should be a list, got {json.dumps(value)[:80]}")
        items = schema.get("items", {})
        return [normalise(v, items, defs, f"{path}[{i}]") for i, v in enumerate(value)]
    if kind == "string" and not isinstance(value, str):
        raise OutputError(f"{path} should be a string, got {json.dumps(value)[:80]}")
    if kind == "integer" and not (
        isinstance(value, int) and not isinstance(value, bool) and _INT64[0] <= value <= _INT64[1]
    ):
        raise OutputError(f"{path} should be an integer, got {json.dumps(value)[:80]}")
    if kind == "number" and not (isinstance(value, int | float) and not isinstance(value, bool)):
        raise OutputError(f"{path} should be a number, got {json.dumps(value)[:80]}")
    if kind == "boolean" and not isinstance(value, bool):
        raise OutputError(f"{path} should be true or false, got {json.dumps(value)[:80]}")
    if kind == "null" and value is not None:
        raise OutputError(f"{path} should be null, got {json.dumps(value)[:80]}")
    return value
