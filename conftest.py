"""Repository-wide pytest setup: hypothesis profiles, the gpu and triton_interpret markers,
and the quantizer backend counter (tests/backend_counter.py).  Nothing here, and no test
module, sets an environment variable at import time: Triton reads TRITON_INTERPRET when it
is imported (its standard library is @jit'd then), so interpreter tests run in their own
process (tests/test_interpreter.py) and the rest of the session keeps the torch paths."""
import os

import pytest
from hypothesis import HealthCheck, settings

pytest_plugins = ["reports.pytest_plugin", "tests.backend_counter"]

# ci: quick, deterministic; thorough: many more examples (make test-thorough), random seeds
# (derandomize=False, printed on failure) so repeated runs explore new inputs.
settings.register_profile("ci", max_examples=60, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("thorough", max_examples=2000, deadline=None, derandomize=False,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _has_cuda() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_configure(config):
    config.addinivalue_line("markers", "triton_interpret: without CUDA, runs Triton kernels in the "
                            "interpreter; collected here, run by tests/test_interpreter.py in a "
                            "process of its own with TRITON_INTERPRET=1")


def interpreter_process() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def pytest_collection_modifyitems(config, items):
    if _has_cuda():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here; run `make test-gpu` on a GPU machine")
    elsewhere = pytest.mark.skip(reason="runs in its own process with TRITON_INTERPRET=1 "
                                        "(tests/test_interpreter.py)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
        elif "triton_interpret" in item.keywords and not interpreter_process():
            item.add_marker(elsewhere)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread_per_xdist_worker():
    # Two xdist workers on two cores: torch's intra-op threads would oversubscribe them.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch
        torch.set_num_threads(1)
    yield

