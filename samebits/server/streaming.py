"""Running engine requests for one HTTP request: merging several, watching for the client leaving, SSE out."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.responses import Response


class ClientGone(Exception):
    """The client closed the connection before the response was complete."""


async def until_disconnect(receive) -> None:
    # Once the body is read, uvicorn's receive() blocks until the connection closes, then says http.disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass


async def race_disconnect(awaitable: Awaitable, receive):
    """Await `awaitable` unless the client leaves first: then cancel it (aborting its requests), raise ClientGone."""
    work = asyncio.ensure_future(awaitable)
    watch = asyncio.ensure_future(until_disconnect(receive))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work
    if work.cancelled():
        raise ClientGone()
    return work.result()


async def merged(starts: list[Callable[[], AsyncIterator]], map_error) -> AsyncIterator[tuple[int, object]]:
    """Interleave several output iterators as (index, item); closing this closes them all (aborting requests).
    The first error from any of them is raised here, passed through `map_error`."""
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.ensure_future(_pump(i, start, queue)) for i, start in enumerate(starts)]
    remaining = len(tasks)
    try:
        while remaining:
            i, item, error = await queue.get()
            if error is not None:
                raise map_error(error)
            if item is None:
                remaining -= 1
                continue
            yield i, item
    finally:
        for t in tasks:
            t.cancel()


async def _pump(i: int, start: Callable[[], AsyncIterator], queue: asyncio.Queue) -> None:
    try:
        async with contextlib.aclosing(start()) as it:
            async for item in it:
                queue.put_nowait((i, item, None))
        queue.put_nowait((i, None, None))
    except Exception as e:  # noqa: BLE001 - handed to the consumer, which turns it into an HTTP error
        queue.put_nowait((i, None, e))


class SSEResponse(Response):
    """Server-sent events from an async iterator of bytes. Unlike Starlette's StreamingResponse it watches for the
    client leaving even while no chunk is due, so an abandoned request is aborted at once, not at its next token."""

    def __init__(self, chunks: AsyncIterator[bytes], headers: dict[str, str], on_disconnect: Callable[[], None]):
        super().__init__(status_code=200)
        self.chunks = chunks
        self.sse_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.on_disconnect = on_disconnect

    async def __call__(self, scope, receive, send) -> None:
        headers = self.sse_headers + [(b"content-type", b"text/event-stream; charset=utf-8"),
                                  (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            await race_disconnect(self._pump(send), receive)
        except (ClientGone, OSError):
            self.on_disconnect()

    async def _pump(self, send) -> None:
        async with contextlib.aclosing(self.chunks) as chunks:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
