"""A small HTTP client of the memmill API, used by the CLI's client commands."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote


def id_segment(item_id: str) -> str:
    """An item id as one percent-encoded path segment, so the server gets back exactly the id.

    Everything outside the unreserved characters is encoded, `/`, `%`, `?` and `#` included
    (left alone, `a%41b` would arrive as `aAb` and `q?x` would lose its query). Dots are
    unreserved, but a segment of only dots would be resolved away by httpx as `.` or `..`,
    so such an id has its dots encoded too."""
    segment = quote(item_id, safe="")
    return segment.replace(".", "%2E") if set(item_id) <= {"."} else segment


class ApiError(Exception):
    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status = status
        self.detail = detail


class Client:
    def __init__(self, url: str, key: str | None, *, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        import httpx  # here, so that `memmill doctor` runs (and reports it) without httpx

        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
        self._http_error = httpx.HTTPError

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self._http.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except self._http_error as exc:
            raise ApiError(0, f"cannot reach {self._http.base_url}: {exc}") from exc
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail", response.text)
            except ValueError:
                detail = response.text
            raise ApiError(response.status_code, str(detail))
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def put(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/items", json=body)

    def get(self, item_id: str, version: int = 0) -> dict[str, Any]:
        params = {"version": version} if version else None
        return self._call("GET", f"/v1/items/{id_segment(item_id)}", params=params)

    def versions(self, item_id: str) -> list[dict[str, Any]]:
        return self._call("GET", f"/v1/item-versions/{id_segment(item_id)}")

    def delete(self, item_id: str, *, purge: bool = False) -> dict[str, Any]:
        params = {"purge": "true"} if purge else None
        return self._call("DELETE", f"/v1/items/{id_segment(item_id)}", params=params)

    def batch(self, entries: list[dict[str, Any]]) -> dict[str, Any]:
        return self._call("POST", "/v1/items/batch", json={"items": entries})

    def upload(
        self, files: list[tuple[str, bytes]], *, tags: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Each file as (item id, bytes); the id travels as the part's file name."""
        data = {"tags": json.dumps(tags)} if tags else None
        parts = [("file", (name, content, "application/octet-stream")) for name, content in files]
        return self._call("POST", "/v1/items/upload", files=parts, data=data)

    def lookup(self, ids: list[str]) -> dict[str, Any]:
        return self._call("POST", "/v1/items/lookup", json={"ids": ids})

    def job(self, job_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/jobs/{id_segment(job_id)}")

    def search(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/search", json=body)

    def jobs(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._call("GET", "/v1/jobs", params={k: v for k, v in params.items() if v})

    def job_stats(self) -> dict[str, Any]:
        return self._call("GET", "/v1/jobs/stats")

    def job_action(self, job_id: str, action: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/jobs/{id_segment(job_id)}/{action}")

    def dead_letters(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._call("GET", "/v1/dead-letters",
                          params={k: v for k, v in params.items() if v is not None})

    def dead_letter(self, dead_letter_id: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/dead-letters/{dead_letter_id}")

    def replay(self, dead_letter_id: int | None, body: dict[str, Any]) -> dict[str, Any]:
        if dead_letter_id is not None:
            return self._call("POST", f"/v1/dead-letters/{dead_letter_id}/replay")
        return self._call("POST", "/v1/dead-letters/replay", json=body)

    def queues(self) -> dict[str, Any]:
        return self._call("GET", "/v1/queues")

    def queue_action(self, kind: str, action: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/queues/{id_segment(kind)}/{action}")

    # agent memory ------------------------------------------------------------------------

    def add_memory(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/memories", json=body)

    def search_memories(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/memories/search", json=body)

    def memory(self, memory_id: str, scope: dict[str, str]) -> dict[str, Any]:
        return self._call("GET", f"/v1/memories/{id_segment(memory_id)}", params=scope)

    def memory_history(self, memory_id: str, scope: dict[str, str]) -> dict[str, Any]:
        return self._call("GET", f"/v1/memories/{id_segment(memory_id)}/history", params=scope)

    def invalidate_memory(self, memory_id: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", f"/v1/memories/{id_segment(memory_id)}/invalidate", json=body)

    def delete_memory(self, memory_id: str, scope: dict[str, str], *,
                      version: int | None = None) -> None:
        """Deletes one memory; with `version`, only if it is still that version (If-Match)."""
        headers = {"If-Match": f'"{version}"'} if version is not None else None
        self._call("DELETE", f"/v1/memories/{id_segment(memory_id)}", params=scope,
                   headers=headers)

    def delete_scope(self, scope: dict[str, str]) -> dict[str, Any]:
        return self._call("POST", "/v1/memories/delete", json={"scope": scope})

    def operation(self, operation_id: str, scope: dict[str, str] | None = None, *,
                  wait_s: float | None = None) -> dict[str, Any]:
        """An operation; with `wait_s` (at most 60) the server answers once it finished or
        when that time ran out, whichever comes first."""
        params: dict[str, Any] = dict(scope or {})
        if wait_s:
            params["wait"] = wait_s
        return self._call("GET", f"/v1/operations/{id_segment(operation_id)}", params=params)

    def sessions(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._call("GET", "/v1/sessions",
                          params={k: v for k, v in params.items() if v is not None})

    def session(self, session_id: str, scope: dict[str, str]) -> dict[str, Any]:
        return self._call("GET", f"/v1/sessions/{id_segment(session_id)}", params=scope)

    def session_events(self, session_id: str, params: dict[str, Any]) -> dict[str, Any]:
        return self._call("GET", f"/v1/sessions/{id_segment(session_id)}/events",
                          params={k: v for k, v in params.items() if v is not None})

    def context(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/context", json=body)

    # tenants, keys and the audit log ----------------------------------------------------------

    def create_tenant(self, name: str) -> dict[str, Any]:
        return self._call("POST", "/v1/tenants", json={"name": name})

    def tenants(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._call("GET", "/v1/tenants",
                          params={k: v for k, v in params.items() if v is not None})

    def tenant(self, tenant_id: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/tenants/{tenant_id}")

    def tenant_action(self, tenant_id: int, action: str) -> dict[str, Any]:
        return self._call("POST", f"/v1/tenants/{tenant_id}/{action}")

    def delete_tenant(self, tenant_id: int) -> dict[str, Any]:
        return self._call("DELETE", f"/v1/tenants/{tenant_id}")

    def create_key(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call("POST", "/v1/keys", json={k: v for k, v in body.items() if v is not None})

    def keys(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._call("GET", "/v1/keys",
                          params={k: v for k, v in params.items() if v is not None})

    def revoke_key(self, key_id: int, tenant_id: int | None = None) -> dict[str, Any]:
        params = {"tenant_id": tenant_id} if tenant_id is not None else None
        return self._call("DELETE", f"/v1/keys/{key_id}", params=params)

    def rotate_key(self, key_id: int, grace_s: int,
                   tenant_id: int | None = None) -> dict[str, Any]:
        params = {"tenant_id": tenant_id} if tenant_id is not None else None
        return self._call("POST", f"/v1/keys/{key_id}/rotate", params=params,
                          json={"grace_s": grace_s})

    def audit(self, params: dict[str, Any]) -> dict[str, Any]:
        return self._call("GET", "/v1/audit",
                          params={k: v for k, v in params.items() if v is not None})

    def limits(self, tenant_id: int) -> dict[str, Any]:
        return self._call("GET", f"/v1/tenants/{tenant_id}/limits")

    def set_limits(self, tenant_id: int, limits: dict[str, int | None]) -> dict[str, Any]:
        return self._call("PUT", f"/v1/tenants/{tenant_id}/limits", json=limits)

    def usage(self) -> dict[str, Any]:
        return self._call("GET", "/v1/usage")
