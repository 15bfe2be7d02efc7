"""server/requests.py read_model: big bodies are parsed one at a time, under the server's lock, after a pass of the
event loop (the health test of tests/server/test_hostile_inputs.py is the load-side proof)."""
from __future__ import annotations

import asyncio
import json

from starlette.requests import Request

from samebits.server.protocol import CompletionRequest
from samebits.server.requests import BIG_BODY_BYTES, read_model


def _request(body: bytes) -> Request:
    scope = {"type": "http", "method": "POST", "path": "/v1/completions",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]}
    sent = False

    async def receive():
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return Request(scope, receive)


def _body(chars: int) -> bytes:
    return json.dumps({"model": "m", "prompt": "w" * chars, "max_tokens": 1}).encode()


def _parse_while_held(chars: int) -> tuple[bool, str]:
    """(parsed while another holder had the lock?, the prompt's first characters once parsed)."""
    async def run():
        turn = asyncio.Lock()
        await turn.acquire()
        task = asyncio.create_task(read_model(_request(_body(chars)), CompletionRequest, 8 << 20, turn))
        for _ in range(5):
            await asyncio.sleep(0)
        early = task.done()
        turn.release()
        return early, (await task).prompt[:3]

    return asyncio.run(run())


def test_a_big_body_waits_for_its_turn_to_be_parsed():
    assert _parse_while_held(BIG_BODY_BYTES) == (False, "www")


def test_negative_control_a_small_body_is_parsed_at_once():
    assert _parse_while_held(BIG_BODY_BYTES // 2) == (True, "www")
