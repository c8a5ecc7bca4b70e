"""The OpenAPI document, made to say what the API really answers.

FastAPI documents only what the routes declare. Much of what a client meets is decided
elsewhere: the key is checked by a middleware (`api.auth`) before any route runs, the body
size by another (`api.limits`), and domain errors and 422s take their shape in `api.errors`.
Declaring all of that on every route would repeat it twenty times and drift; instead the
document is generated once and completed here by rules that follow from those places:

- every `/v1/` operation requires a key (HTTP bearer or `X-API-Key`) and may answer 401, and
  503 when the database cannot check the key;
- an operation that takes parameters or a body may answer 422, in `ValidationProblem`'s
  shape; one with a body may answer 413; one with a path parameter names a resource: 404;
- the few answers no rule derives (409 of a retry, a cancel or a replay; 503 of /healthz) and
  the upload's multipart body, which its route reads by hand, are listed below.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from pydantic.json_schema import models_json_schema

from api.auth import PROTECTED_PREFIX
from api.roles import role_needed
from api.schemas import Problem, QuotaProblem, ValidationProblem

REF = "#/components/schemas/{model}"

SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "bearer": {"type": "http", "scheme": "bearer",
               "description": "`Authorization: Bearer <key>`"},
    "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key",
               "description": "`X-API-Key: <key>`, the same key"},
}
# Either scheme alone is enough: a list of alternatives.
SECURITY = [{"bearer": []}, {"apiKey": []}]

DESCRIPTIONS = {
    401: "No key, or one that is wrong or revoked (`WWW-Authenticate: Bearer`).",
    403: "The key's role may not do this (`detail` names the role it needs), or the key is "
         "bound to another user or agent than the request names.",
    404: "No such resource in this tenant.",
    409: "The resource is not in a state that allows this.",
    413: "The body, or content in it, is larger than the configured limit.",
    422: "The request is not valid: `detail` says what is wrong, `errors` where.",
    429: "Over one of the tenant's limits: `limit` names it; nothing was written; retry after "
         "`Retry-After`.",
    503: "The database (or Redis) cannot be reached; try again shortly.",
}

# The headers `api.auth.Authenticate` sends with its answers.
HEADERS = {
    401: {"WWW-Authenticate": {"description": "`Bearer`", "schema": {"type": "string"}}},
    429: {"Retry-After": {"description": "whole seconds", "schema": {"type": "string"}}},
    503: {"Retry-After": {"description": "seconds", "schema": {"type": "string"}}},
}

# Answers that no rule derives from the route, by (method, path).
EXTRA_STATUSES: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/jobs/{job_id}/retry"): (409,),
    ("post", "/v1/jobs/{job_id}/cancel"): (409,),
    ("post", "/v1/dead-letters/{dead_letter_id}/replay"): (409,),
    # A stale version, or a session written with another scope than it was created with.
    ("patch", "/v1/memories/{memory_id}"): (409,),
    ("post", "/v1/memories/{memory_id}/invalidate"): (409,),
    ("delete", "/v1/memories/{memory_id}"): (409,),
    ("post", "/v1/sessions/{session_id}/events"): (409,),
    # The session named is not one the scope may read.
    ("post", "/v1/context"): (404,),
    # A tenant named by `tenant_id` that is not the key's (only an operator's may name
    # another), or by name, that does not exist; a tenant being deleted; a name taken; the
    # operator's own tenant; a revoked key rotated.
    ("post", "/v1/keys"): (404, 409),
    ("get", "/v1/keys"): (404,),
    ("get", "/v1/audit"): (404,),
    ("get", "/v1/tenants"): (404,),
    ("post", "/v1/tenants"): (409,),
    ("post", "/v1/tenants/{tenant_id}/suspend"): (409,),
    ("post", "/v1/tenants/{tenant_id}/resume"): (409,),
    ("delete", "/v1/tenants/{tenant_id}"): (409,),
    ("post", "/v1/keys/{key_id}/rotate"): (409,),
    # A stale version; a scratchpad not there to delete.
    ("put", "/v1/working-memory"): (409,),
    ("delete", "/v1/working-memory"): (404,),
    # A run not finished, a dry run, or one undone already.
    ("post", "/v1/consolidation/runs/{run_id}/undo"): (409,),
    # Another run of the tenant has not finished.
    ("post", "/v1/consolidation/runs"): (409,),
}
# Health checks answer 503 with the same body as their 200, saying what is missing.
UNHEALTHY = {
    ("get", "/healthz"): "Postgres or Redis does not answer; the body says which.",
}

UPLOAD_PATH = "/v1/items/upload"
# The upload route streams each file against its own limit, so it reads the form itself and
# FastAPI cannot see its shape: this is it.
UPLOAD_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {
                    "file": {
                        "type": "array",
                        "minItems": 1,
                        "items": {"type": "string", "format": "binary"},
                        "description": "One part per file; its file name is the item's id"
                                       " (after `prefix`).",
                    },
                    "prefix": {"type": "string",
                               "description": "Put before every file name to make its id."},
                    "tags": {"type": "string", "contentMediaType": "application/json",
                             "description": 'A JSON object of strings, set on every file:'
                                            ' {"topic": "baking"}.'},
                },
                "additionalProperties": False,
            },
        },
    },
}

AUTH_HEADERS = {"authorization", "x-api-key"}


def install(app: FastAPI) -> None:
    """Serve the completed document at `app.openapi_url`, built once on first request."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = complete(generate())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(document: dict[str, Any]) -> dict[str, Any]:
    """The document FastAPI generated, with the answers the API gives but no route declares."""
    components = document.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    _, problems = models_json_schema(
        [(Problem, "serialization"), (ValidationProblem, "serialization"),
         (QuotaProblem, "serialization")], ref_template=REF)
    schemas.update(problems["$defs"])
    components["securitySchemes"] = SECURITY_SCHEMES
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            _complete_operation(path, method, operation, schemas)
    return document


SCOPE_FIELDS = frozenset({"user_id", "agent_id", "scope"})


def _scoped(operation: dict[str, Any], schemas: dict[str, Any]) -> bool:
    """Whether the request names a user or agent (a parameter, or a field of its JSON body):
    a key bound to another one is refused with a 403 (api/binding.py)."""
    if any(p["name"] in SCOPE_FIELDS for p in operation.get("parameters", [])):
        return True
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    ref = body.get("schema", {}).get("$ref", "")
    properties = schemas.get(ref.rsplit("/", 1)[-1], {}).get("properties", {})
    return bool(SCOPE_FIELDS & properties.keys())


def _complete_operation(path: str, method: str, operation: dict[str, Any],
                        schemas: dict[str, Any]) -> None:
    if method == "post" and path == UPLOAD_PATH:
        operation["requestBody"] = UPLOAD_BODY
    # The key is a security scheme, never a parameter of its own.
    parameters = [p for p in operation.get("parameters", [])
                  if not (p["in"] == "header" and p["name"].lower() in AUTH_HEADERS)]
    if parameters:
        operation["parameters"] = parameters
    else:
        operation.pop("parameters", None)
    responses = operation.setdefault("responses", {})
    responses.pop("422", None)
    if (method, path) in UNHEALTHY and "200" in responses:
        responses["503"] = {**responses["200"], "description": UNHEALTHY[(method, path)]}
    statuses: set[int] = set(EXTRA_STATUSES.get((method, path), ()))
    if path.startswith(PROTECTED_PREFIX):
        operation["security"] = SECURITY
        statuses |= {401, 429, 503}
        if role_needed(method.upper(), path) != "read" or _scoped(operation, schemas):
            statuses.add(403)
    if parameters or "requestBody" in operation:
        statuses.add(422)
    if "requestBody" in operation:
        statuses.add(413)
    if any(p["in"] == "path" for p in parameters):
        statuses.add(404)
    for status in sorted(statuses):
        model = {422: ValidationProblem, 429: QuotaProblem}.get(status, Problem)
        responses[str(status)] = {
            "description": DESCRIPTIONS[status],
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
            **({"headers": HEADERS[status]} if status in HEADERS else {}),
        }
