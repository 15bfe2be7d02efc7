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
