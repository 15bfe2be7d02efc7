"""samebits.server: the OpenAI-compatible HTTP server.

    samebits serve --model smollm2-135m [--port 8000] [--api-key KEY ...]     # binds 127.0.0.1 unless --host says

POST /v1/completions and /v1/chat/completions (stream or not), GET /v1/models, /health, /version, /metrics. Every
response carries the X-Samebits-* numerics headers and X-Request-Id; generation responses add X-Samebits-Seed (also
`seed` in the body), so a sampled response replays exactly when sent again with that seed. Choices carry their
`token_ids`. Errors are OpenAI error JSON with a 4xx for every client mistake.

Pieces: config (ServerConfig, holding the EngineConfig), protocol (request models), requests (parse, check, build a
Job), run (engine requests, disconnect watch, SSE out), responses (bodies, stream chunks), state (ServerState,
numerics headers), errors, middleware (headers, limits, auth), metrics, app (build_app, routes), serve.
"""
