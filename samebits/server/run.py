"""Running one HTTP request's engine requests: merged outputs, a watch for the client leaving, then the whole body
or the SSE stream."""
from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from samebits.server.errors import aborted, map_error
from samebits.server.requests import Job, Sub
from samebits.server.responses import DONE_EVENT, StreamWriter, chat_body, error_event, json_response, text_body
from samebits.server.state import ServerState
from samebits.server.tool_stream import ToolStreamWriter

STATUS_CLIENT_GONE = 499  # nginx's convention; nobody reads it, but logs and metrics do


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


async def merged(starts: list[Callable[[], AsyncIterator]]) -> AsyncIterator[tuple[int, object]]:
    """Interleave several output iterators as (index, item); closing this closes them all (aborting requests).
    The first error from any of them is raised here as the client's error."""
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
    """Server-sent events: a StreamWriter's events for each output of `outputs` (`first` already taken), as one
    loop that sends each event as it is rendered, with no generator between the engine's iterator and the send.
    Unlike Starlette's StreamingResponse it watches for the client leaving even while no chunk is due, so an
    abandoned request is aborted at once, not at its next token."""

    def __init__(self, writer: StreamWriter, first, outputs: AsyncIterator, feed: Callable[[object], list[bytes]],
                 headers: dict[str, str], on_disconnect: Callable[[], None]):
        super().__init__(status_code=200)
        self.writer, self.first, self.outputs, self.feed = writer, first, outputs, feed
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
        """The events, then [DONE], then the end of the body. An error from the engine or from rendering ends the
        stream as its last event; an error from a send is not the client's to read and propagates. Leaving in any
        way closes `outputs` (aborting its requests)."""
        outputs, feed = self.outputs, self.feed
        try:
            events, done = _rendered(self.writer.opening)
            if not done:
                more, done = _rendered(feed, self.first)
                events += more
            while True:
                for event in events:
                    await send({"type": "http.response.body", "body": event, "more_body": True})
                if done:
                    break
                try:
                    events = feed(await outputs.__anext__())
                except StopAsyncIteration:
                    events, done = _rendered(self.writer.closing)[0], True
                except Exception as e:  # noqa: BLE001 - mid-stream, every error becomes the stream's last event
                    events, done = [error_event(e)], True
        finally:
            await outputs.aclose()
        await send({"type": "http.response.body", "body": DONE_EVENT, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _rendered(render: Callable, *args) -> tuple[list[bytes], bool]:
    """(render's events, False), or ([the error event], True) when it raises: the stream ends there."""
    try:
        return render(*args), False
    except Exception as e:  # noqa: BLE001 - the status is already 200: the error travels as an event
        return [error_event(e)], True


# ---- running jobs ----------------------------------------------------------------------------------------------
def _outputs(state: ServerState, job: Job, final_only: bool = False):
    """(sub-request index, cumulative output) pairs of all the job's engine requests."""
    def start(s: Sub):
        return state.ae.generate(s.request_id, s.ids, job.params, prompt=s.text, final_only=final_only)

    if len(job.subs) == 1:  # the common case skips the merging task and queue: one wake-up less per step
        return _single(start(job.subs[0]))
    return merged([lambda s=s: start(s) for s in job.subs])


async def _single(outputs):
    try:
        async with contextlib.aclosing(outputs) as it:
            async for out in it:
                yield 0, out
    except Exception as e:  # noqa: BLE001 - every engine-side error becomes an HTTP error
        raise map_error(e) from None


async def _collect(state: ServerState, job: Job) -> list:
    last: dict[int, object] = {}
    async with contextlib.aclosing(_outputs(state, job, final_only=True)) as outputs:
        async for i, out in outputs:
            last[i] = out
    if len(last) != len(job.subs) or not all(o.finished for o in last.values()):
        raise aborted()
    return [last[i] for i in range(len(job.subs))]


def _named_by(job: Job, out) -> None:
    """The response's system_fingerprint is the engine's that computed it, as its output says: a weight update
    (server/admin.py) between the request's parsing and its run cannot leave the old version's name on it."""
    if isinstance(out.fingerprint, str):
        job.meta.system_fingerprint = out.fingerprint


def _job_headers(job: Job) -> dict[str, str]:
    return {"X-Samebits-Seed": str(job.meta.seed)}


async def respond(state: ServerState, request: Request, job: Job, stream: bool) -> Response:
    if stream:
        return await _respond_stream(state, request, job)
    try:
        outs = await race_disconnect(_collect(state, job), request.receive)
    except ClientGone:
        state.metrics.disconnects.inc()
        return Response(status_code=STATUS_CLIENT_GONE)
    _named_by(job, outs[0])
    body = (text_body if job.kind == "text" else chat_body)(state, job, outs)
    return json_response(body, _job_headers(job))


async def _respond_stream(state: ServerState, request: Request, job: Job) -> Response:
    if len(job.subs) == 1:  # the engine's own iterator: no generator between it and the stream's loop
        sub = job.subs[0]
        outputs = state.ae.generate(sub.request_id, sub.ids, job.params, prompt=sub.text)
    else:
        outputs = _outputs(state, job)
    try:
        # The first output is awaited before the 200 goes out, so a full queue or a bad request gets its status code.
        first = await race_disconnect(outputs.__anext__(), request.receive)
    except ClientGone:
        state.metrics.disconnects.inc()
        await outputs.aclose()
        return Response(status_code=STATUS_CLIENT_GONE)
    except StopAsyncIteration:
        raise aborted() from None
    except Exception as e:  # noqa: BLE001 - every engine-side error becomes an HTTP error
        raise map_error(e) from None
    _named_by(job, first if len(job.subs) == 1 else first[1])
    # After the first output: every chunk carries its engine's fingerprint.
    writer = (StreamWriter if job.tools is None else ToolStreamWriter)(state, job)
    if len(job.subs) == 1:
        feed = functools.partial(writer.feed, 0)
    else:
        def feed(pair):
            return writer.feed(*pair)
    return SSEResponse(writer, first, outputs, feed, _job_headers(job), state.metrics.disconnects.inc)
