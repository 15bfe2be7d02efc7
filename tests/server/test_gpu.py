"""The server on CUDA (carry the server wheels to the GPU machine): 64 concurrent streams equal their solo runs."""
from __future__ import annotations

import pytest

from tests.server.conftest import start_server
from tests.server.test_load import check_streams_equal_solo_runs

pytestmark = pytest.mark.gpu


def test_concurrent_streams_equal_solo_runs_on_cuda(tiny_model_dir):
    from tests.server.conftest import make_engine

    live = start_server(make_engine(tiny_model_dir, device="cuda"))
    try:
        assert live.engine.fingerprint().get("cuda_runtime")
        check_streams_equal_solo_runs(live)
    finally:
        live.stop()


def test_the_default_backend_on_cuda_is_the_engine_process_and_answers_as_the_thread(tiny_model_dir):
    """engine_process=None picks the engine's own process on CUDA (server/config.py); it answers every request of
    test_engine_process.py bit for bit as the thread backend on the same GPU does."""
    import concurrent.futures

    from samebits.engine.engine_process import ProcessAsyncEngine
    from samebits.server.config import ServerConfig
    from samebits.server.serve import template
    from tests.server.test_engine_process import KEY, MODEL_NAME, REQUESTS, SEED, _comparable, _live, _post

    base = {"model": str(tiny_model_dir), "served_model_name": MODEL_NAME, "port": 0, "log_level": "warning",
            "device": "cuda", "max_num_seqs": 128, "max_model_len": 256, "kv_cache_tokens": 16384, "seed": SEED,
            "api_keys": (KEY,)}
    auto, thread = ServerConfig.from_dict(base), ServerConfig.from_dict({**base, "engine_process": False})
    with template(auto), concurrent.futures.ThreadPoolExecutor(1) as pool:
        child = pool.submit(_live, auto)
        servers = [_live(thread), child.result()]
        try:
            assert isinstance(servers[1].async_engine, ProcessAsyncEngine)
            assert not isinstance(servers[0].async_engine, ProcessAsyncEngine)
            answers = [[_comparable(_post(live, path, {"model": MODEL_NAME, **body})) for path, body in REQUESTS]
                       for live in servers]
            for request, a, b in zip(REQUESTS, *answers):
                assert a == b, request
        finally:
            for s in servers:
                s.stop()
                s.async_engine.shutdown()
