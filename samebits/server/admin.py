"""Admin routes: weight sync into the running server (engine/weights.py), only behind an API key.

`POST /admin/update_weights {"path": ..., "version": ...}` reads an HF folder's safetensors (or one .safetensors
file) on the server's host, casts them to the engine's dtype as a load would, and copies them in on the engine thread
between steps; `GET /admin/weights` names the weights serving now. A server started without API keys answers 403:
an open admin route would let any client replace the model. Errors are APIErrors, rendered by the app's handler.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import Response

from samebits.server.config import API_KEY_SOURCES
from samebits.server.errors import APIError, invalid
from samebits.server.requests import read_model
from samebits.server.responses import json_response
from samebits.server.state import numerics_headers


class UpdateWeightsRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    version: str | None = None


def add_admin_routes(app: FastAPI, state) -> None:
    @app.post("/admin/update_weights")
    async def update_weights(request: Request) -> Response:
        _require_key(state)
        req = await read_model(request, UpdateWeightsRequest, state.config.max_body_bytes, state.parse_turn)
        tensors = await asyncio.to_thread(_read_tensors, req.path, state.engine.info().dtype)
        version = await _update(state.ae, tensors, req.version)
        state.fingerprint.clear()
        state.fingerprint.update(state.engine.fingerprint())
        state.headers.clear()
        state.headers.update(numerics_headers(state.fingerprint))  # the middleware's headers name the new weights
        return json_response(_weights(state, version), {})

    @app.get("/admin/weights")
    async def weights() -> Response:
        _require_key(state)
        return json_response(_weights(state, state.fingerprint.get("weights")), {})


def _weights(state, version) -> dict:
    return {"object": "weights", "model": state.model_name, "weights": version, "fingerprint": state.fingerprint["hash"]}


def _require_key(state) -> None:
    if not state.api_keys:
        raise APIError(403, f"Admin routes need an API key: start the server with {API_KEY_SOURCES}.",
                       code="admin_disabled")


async def _update(ae, tensors: dict, version: str | None) -> str:
    from samebits.engine.weights import EngineBusy

    try:
        return await ae.command("update_weights", tensors, version)
    except EngineBusy as e:
        raise APIError(409, f"{e}.", code="engine_busy") from None
    except ValueError as e:  # WeightsError: nothing was copied, the old weights serve on
        raise invalid(str(e), "path") from None


def _read_tensors(path: str, dtype) -> dict:
    from safetensors import SafetensorError

    from samebits.models.loader_hf import iter_tensors, safetensors_files

    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".safetensors":
        files = [p]
    elif p.is_dir():
        try:
            files = safetensors_files(p)
        except FileNotFoundError as e:
            raise invalid(str(e), "path") from None
    else:
        raise invalid(f"path: {path!r} is neither an HF model folder nor a .safetensors file on the server.", "path")
    try:
        return {name: t.to(dtype) for name, t in iter_tensors(files)}
    except (OSError, SafetensorError) as e:  # a truncated or foreign file: the operator's input, not a server fault
        raise invalid(f"path: cannot read safetensors from {path!r}: {e}", "path") from None
