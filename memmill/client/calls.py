"""What a client method asks of the API, apart from how it is sent.

Every operation is written once, as a function that builds a `Call` (method, path, body, and
how to read the answer into the API's own pydantic model). The `endpoint` and `pages`
descriptors turn it into a method of both clients: on a sync client's resource it returns the
model, on an async one an awaitable of it, with the builder's own parameters either way (a
`ParamSpec`), so editors and type checkers see the real signature of both without a second
copy of any of them. The runners in `memmill.client.transport` send the calls.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, Literal, ParamSpec, TypeVar, overload
from urllib.parse import quote

if TYPE_CHECKING:
    from memmill.client.transport import AsyncRunner, SyncRunner

T = TypeVar("T")
P = ParamSpec("P")
Mode = TypeVar("Mode", "Sync", "Async")


class Sync:
    """Marks a resource of the sync client."""


class Async:
    """Marks a resource of the async client."""


@dataclass(frozen=True)
class Wait:
    """What to wait for once a write is answered: its operations (`operation_ids` of the
    answer) or its items (`item_ids`) to finish, for at most `timeout_s`. A failed operation
    always raises; a failed item only with `raise_on_failure` (a batch reports its items)."""

    timeout_s: float
    operation_ids: Callable[[Any], list[str]] = field(default=lambda _: [])
    item_ids: Callable[[Any], list[str]] = field(default=lambda _: [])
    scope: Mapping[str, str] | None = None
    raise_on_failure: bool = True


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request and how to read its answer. `idempotent` calls are also retried after a
    connection error (a write might have been applied before the connection broke)."""

    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
    path: str
    read: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    files: Any = None
    data: Mapping[str, str] | None = None
    headers: Mapping[str, str] | None = None
    wait: Wait | None = None

    @property
    def idempotent(self) -> bool:
        return self.method in ("GET", "PUT", "DELETE")

    def query(self) -> dict[str, Any] | None:
        """The query parameters that are set (None is left out; booleans as true/false)."""
        if not self.params:
            return None
        return {k: ("true" if v else "false") if isinstance(v, bool) else v
                for k, v in self.params.items() if v is not None}


@dataclass(frozen=True)
class PageCall(Generic[T]):
    """The first page of a listing, how to find the rows of a page and how to ask for the
    next (None: that was the last)."""

    first: Call[Any]
    rows: Callable[[Any], list[T]]
    next_params: Callable[[Any, Mapping[str, Any]], Mapping[str, Any] | None]


def segment(value: str) -> str:
    """An id as one percent-encoded path segment, so the server gets back exactly the id.

    Everything outside the unreserved characters is encoded, `/`, `%`, `?` and `#` included
    (left alone, `a%41b` would arrive as `aAb` and `q?x` would lose its query). Dots are
    unreserved, but a segment of only dots would be resolved away as `.` or `..`, so such an
    id has its dots encoded too."""
    encoded = quote(value, safe="")
    return encoded.replace(".", "%2E") if set(value) <= {"."} else encoded


def cursor_pages(page: Any, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The next page of a listing that answers `next_cursor`."""
    cursor = page.next_cursor
    return None if cursor is None else {**params, "cursor": cursor}


def offset_pages(page: Any, params: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The next page of a listing by `limit` and `offset` that answers its total `count`."""
    offset = int(params.get("offset") or 0) + len(page.data)
    return None if not page.data or offset >= page.count else {**params, "offset": offset}


class Resource(Generic[Mode]):
    """A group of operations; `runner` sends its calls (blocking, or as coroutines)."""

    def __init__(self, runner: SyncRunner | AsyncRunner) -> None:
        self._runner = runner


class endpoint(Generic[P, T]):
    """A method that sends the `Call` its builder makes (see the module docstring)."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        self._build = build
        self.__doc__ = build.__doc__
        self.__name__ = build.__name__

    @overload
    def __get__(self, obj: Resource[Sync], owner: type | None = None) -> Callable[P, T]: ...

    @overload
    def __get__(
        self, obj: Resource[Async], owner: type | None = None
    ) -> Callable[P, Awaitable[T]]: ...

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        build, runner = self._build, obj._runner

        def method(*args: Any, **kwargs: Any) -> Any:
            return runner.run(build(obj, *args, **kwargs))

        method.__doc__, method.__name__ = self.__doc__, self.__name__
        return method


class pages(Generic[P, T]):
    """A method that walks every page of a listing: an iterator of its rows on a sync
    client, an async iterator on an async one."""

    def __init__(self, build: Callable[Concatenate[Any, P], PageCall[T]]) -> None:
        self._build = build
        self.__doc__ = build.__doc__
        self.__name__ = build.__name__

    @overload
    def __get__(self, obj: Resource[Sync], owner: type | None = None) -> Callable[P, Iterator[T]]:
        ...

    @overload
    def __get__(
        self, obj: Resource[Async], owner: type | None = None
    ) -> Callable[P, AsyncIterator[T]]: ...

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        build, runner = self._build, obj._runner

        def method(*args: Any, **kwargs: Any) -> Any:
            return runner.walk(build(obj, *args, **kwargs))

        method.__doc__, method.__name__ = self.__doc__, self.__name__
        return method
