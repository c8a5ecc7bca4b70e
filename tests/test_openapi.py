"""The OpenAPI document tells the truth, and `/docs` shows it without leaving the server.

Schemathesis generates requests for every operation from the served document (valid ones,
and ones the document calls invalid), sends them to the real API under uvicorn with a valid
key, and checks every answer: never a 5xx, only documented statuses, bodies and content types
as documented, the key required where the document says so, and what the document forbids
refused. It runs in a thread, because the server runs in this test's event loop; the run is
seeded and bounded (a fixed number of examples per operation, a deadline per example), so a
failure replays the same way.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from collections import Counter
from datetime import timedelta
from typing import Any

import httpx
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.checks import not_a_server_error
from schemathesis.errors import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.schemas import INT64_MAX, INT64_MIN

# Examples per operation and mode: 18 operations x 2 modes x 80 ≈ 2500 requests, 30-45 s on
# 2 cores. MEMMILL_FUZZ_EXAMPLES=500 searches harder (about 2 minutes).
MAX_EXAMPLES = int(os.environ.get("MEMMILL_FUZZ_EXAMPLES", "80"))
DEADLINE = timedelta(seconds=10)  # per example; a request taking this long is a finding
REQUEST_TIMEOUT_S = 30

CONFORMANCE = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    ignored_auth,
]
CHECKS = {
    schemathesis.GenerationMode.POSITIVE: CONFORMANCE,
    schemathesis.GenerationMode.NEGATIVE: [*CONFORMANCE, negative_data_rejection],
}
# Health checks answer a documented 503 by design while no worker runs, as here.
HEALTH_PATHS = ("/healthz", "/readyz")
# A valid request to these retires the fuzzing key itself when it names its id (1, a value
# the generator loves), and every later request is a 401: they get invalid requests only.
# Their valid uses are tested in tests/test_hosting.py.
RETIRE_KEYS = ("DELETE /v1/keys/{key_id}", "POST /v1/keys/{key_id}/rotate")


@schemathesis.serializer("application/x-ndjson")
def _ndjson(ctx: Any, value: Any) -> bytes:
    """POST /v1/import takes NDJSON: a generated value is sent as one JSON line."""
    return json.dumps(value).encode() + b"\n"


def fuzz(api_url: str, key: str, mode: schemathesis.GenerationMode) -> tuple[list[str], Counter]:
    """Every operation's findings in one mode, as readable reports, and the statuses seen."""
    config = schemathesis.Config.from_dict(
        {"generation": {"with-security-parameters": False}})
    schema = schemathesis.openapi.from_url(f"{api_url}/openapi.json", config=config)
    failures: list[str] = []
    seen: Counter = Counter()
    headers = {"Authorization": f"Bearer {key}"}
    with requests.Session() as session:
        for result in schema.get_all_operations():
            operation = result.ok()
            if mode is schemathesis.GenerationMode.POSITIVE and operation.label in RETIRE_KEYS:
                continue
            try:
                fuzz_operation(operation, mode, api_url, session, headers, seen)
            except hypothesis.errors.Unsatisfiable:
                # Nothing of it can be made invalid (no parameters, or only a path string).
                assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
            # Not only the first: every operation's failures are reported.
            except (Exception, FailureGroup) as exc:  # noqa: BLE001
                failures.append(f"{mode.value} {operation.label}: {exc}")
    return failures, seen


def fuzz_operation(operation: schemathesis.APIOperation, mode: schemathesis.GenerationMode,
                   api_url: str, session: requests.Session, headers: dict[str, str],
                   seen: Counter) -> None:
    checks = CHECKS[mode]
    if operation.path in HEALTH_PATHS:
        checks = [c for c in checks if c is not not_a_server_error]
    if any(body.media_type.startswith("multipart/") for body in operation.body):
        # In a form every value is text on the wire: a null or a number the generator meant
        # as invalid arrives as the valid text "null" or "5".
        checks = [c for c in checks if c is not negative_data_rejection]

    @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
    @hypothesis.settings(
        max_examples=MAX_EXAMPLES, deadline=DEADLINE, derandomize=True, database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck), print_blob=False,
    )
    def run(case: schemathesis.Case) -> None:
        response = case.call_and_validate(
            base_url=api_url, session=session, headers=headers, checks=checks,
            timeout=REQUEST_TIMEOUT_S)
        seen[operation.label, response.status_code] += 1

    run()


@pytest.mark.slow  # a minute and a half of fuzzing (see conftest)
async def test_the_api_answers_what_its_document_says(
    api_url: str, tenant: tuple[int, str]
) -> None:
    key = tenant[1]
    async with httpx.AsyncClient(base_url=api_url, timeout=120) as http:
        # The first search waits for the embedding model; the deadline is for the API's work.
        warm = await http.post("/v1/search", json={"query": "warm up"},
                               headers={"Authorization": f"Bearer {key}"})
        assert warm.status_code == 200, warm.text
    started = time.monotonic()
    failures: list[str] = []
    seen: Counter = Counter()
    for mode in CHECKS:
        found, statuses = await asyncio.to_thread(fuzz, api_url, key, mode)
        failures += found
        seen += statuses
    elapsed = time.monotonic() - started
    assert not failures, f"{len(failures)} operations failed:\n\n" + "\n\n".join(failures)
    doc = await document(api_url)
    labels = {f"{method.upper()} {path}" for method, path, _ in operations(doc)}
    assert {label for label, _ in seen} == labels  # every operation was sent requests
    print(f"{sum(seen.values())} requests in {elapsed:.0f} s:", dict(sorted(seen.items())))


# --- The document itself, read without sending anything else.

async def document(api_url: str) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=api_url) as http:
        r = await http.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, ops in doc["paths"].items() for method, op in ops.items()]


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


async def test_the_document_names_its_security_schemes_and_error_answers(
    api_url: str,
) -> None:
    doc = await document(api_url)
    assert doc["components"]["securitySchemes"] == {
        "bearer": {"type": "http", "scheme": "bearer",
                   "description": "`Authorization: Bearer <key>`"},
        "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key",
                   "description": "`X-API-Key: <key>`, the same key"},
    }
    schemas = doc["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    assert schemas["ValidationProblem"]["required"] == ["detail", "errors"]
    assert schemas["Problem"]["required"] == ["detail"]
    for method, path, op in operations(doc):
        where = f"{method.upper()} {path}"
        responses = op["responses"]
        documented = set(responses)
        for header in op.get("parameters", []):
            assert header["name"].lower() not in ("authorization", "x-api-key"), where
        if path.startswith("/v1/"):
            assert op["security"] == [{"bearer": []}, {"apiKey": []}], where
            assert {"401", "503"} <= documented, where
        else:
            assert "security" not in op, where
            assert "401" not in documented, where
        if op.get("parameters") or "requestBody" in op:
            assert responses["422"]["content"]["application/json"]["schema"] == \
                ref("ValidationProblem"), where
        if "requestBody" in op:
            assert "413" in documented, where
        if any(p["in"] == "path" for p in op.get("parameters", [])):
            assert "404" in documented, where
        for status in documented - {"422"}:
            if status.startswith("4") or (status == "503" and path.startswith("/v1/")):
                assert responses[status]["content"]["application/json"]["schema"] == \
                    ref("QuotaProblem" if status == "429" else "Problem"), (where, status)
    for conflict in ("/v1/jobs/{job_id}/retry", "/v1/jobs/{job_id}/cancel",
                     "/v1/dead-letters/{dead_letter_id}/replay"):
        assert "409" in doc["paths"][conflict]["post"]["responses"], conflict
    assert "503" in doc["paths"]["/healthz"]["get"]["responses"]


async def test_the_upload_documents_its_multipart_body(api_url: str) -> None:
    body = (await document(api_url))["paths"]["/v1/items/upload"]["post"]["requestBody"]
    schema = body["content"]["multipart/form-data"]["schema"]
    assert body["required"] is True
    assert schema["required"] == ["file"]
    assert schema["properties"]["file"]["items"] == {"type": "string", "format": "binary"}
    assert set(schema["properties"]) == {"file", "prefix", "tags"}


def integers(schema: Any, doc: dict[str, Any], seen: frozenset[str] = frozenset()) -> list[Any]:
    """Every integer schema reachable from `schema`, following references once each."""
    if isinstance(schema, list):
        return [i for s in schema for i in integers(s, doc, seen)]
    if not isinstance(schema, dict):
        return []
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name in seen:
            return []
        return integers(doc["components"]["schemas"][name], doc, seen | {name})
    found = [schema] if schema.get("type") == "integer" else []
    return found + [i for value in schema.values() for i in integers(value, doc, seen)]


async def test_every_integer_a_client_sends_is_bounded_to_int64(api_url: str) -> None:
    """asyncpg cannot send an integer past int64: every one a request carries says so."""
    doc = await document(api_url)
    unbounded = []
    for method, path, op in operations(doc):
        sent = [p["schema"] for p in op.get("parameters", [])]
        sent += [c["schema"] for c in op.get("requestBody", {}).get("content", {}).values()]
        for schema in integers(sent, doc):
            low, high = schema.get("minimum", INT64_MIN - 1), schema.get("maximum", INT64_MAX + 1)
            if low < INT64_MIN or high > INT64_MAX:
                unbounded.append(f"{method.upper()} {path}: {schema}")
    assert not unbounded, "\n".join(unbounded)
    limit = doc["components"]["schemas"]["SearchRequest"]["properties"]["limit"]
    assert (limit["type"], limit["minimum"], limit["maximum"]) == ("integer", 1, 100)


PYDANTIC_WORDS = {"ge", "le", "gt", "lt", "min_length", "max_length", "multiple_of", "strict"}


def leaked(node: Any, where: str = "") -> list[str]:
    """Places where a pydantic constraint's name stands in the document instead of its JSON
    Schema keyword (`le` for `maximum`): a client would not see the bound."""
    if isinstance(node, list):
        return [w for i, item in enumerate(node) for w in leaked(item, f"{where}/{i}")]
    if not isinstance(node, dict):
        return []
    found = [f"{where}/{k}" for k in node if k in PYDANTIC_WORDS
             and not where.endswith("/properties")]
    return found + [w for k, v in node.items() for w in leaked(v, f"{where}/{k}")]


async def test_the_document_states_bounds_in_json_schema_keywords(api_url: str) -> None:
    assert leaked(await document(api_url)) == []
    assert leaked({"properties": {"k": {"anyOf": [{"type": "integer", "le": 9}]}}}) == [
        "/properties/k/anyOf/0/le"]


async def test_an_integral_number_is_an_integer_as_json_schema_says(
    api_url: str, tenant: tuple[int, str]
) -> None:
    headers = {"Authorization": f"Bearer {tenant[1]}"}
    async with httpx.AsyncClient(base_url=api_url, headers=headers, timeout=120) as http:
        ok = await http.post("/v1/search", json={"query": "bread", "limit": 64.0, "k": 60.0})
        fraction = await http.post("/v1/search", json={"query": "bread", "limit": 2.5})
        replay = await http.post("/v1/dead-letters/replay", json={"limit": 10.0})
        jobs = await http.get("/v1/jobs", params={"limit": "5.0"})
    assert ok.status_code == 200, ok.text
    assert fraction.status_code == 422 and "limit" in fraction.json()["detail"]
    assert replay.status_code == 200, replay.text
    assert jobs.status_code == 200, jobs.text


# --- /docs

async def test_docs_are_served_without_any_other_server(api_url: str) -> None:
    """The page and every file it loads come from the API; nothing names another host."""
    async with httpx.AsyncClient(base_url=api_url) as http:
        page = await http.get("/docs")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        html = page.text
        assert not re.search(r"(https?:)?//", html.replace("http-equiv", "")), html
        assert '"validatorUrl": null' in html
        assets = re.findall(r'(?:href|src)="([^"]+)"', html)
        assets += re.findall(r"url: '([^']+)'", html)
        assert len(assets) == 4, assets  # stylesheet, icon, script, the document
        kinds = {}
        for asset in assets:
            r = await http.get(asset)
            assert r.status_code == 200, asset
            assert len(r.content) > 100, asset
            kinds[asset.rsplit(".", 1)[-1]] = r.headers["content-type"]
    assert kinds["js"].startswith(("text/javascript", "application/javascript"))
    assert kinds["css"].startswith("text/css")
    assert kinds["json"].startswith("application/json")
    assert kinds["png"].startswith("image/png")
    async with httpx.AsyncClient(base_url=api_url) as http:
        assert (await http.get("/redoc")).status_code == 404
