"""Process-wide test setup, imported by pytest before any test module."""
import os

# Triton kernels run on CPU through the interpreter. The switch is read when `triton.language` and the kernels are
# decorated, so it must be set before the first test module that imports triton (transformers' DeepSeek-V4 does,
# through its own kernels) is collected, not only in test_kernels.py.
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


@pytest.fixture
def one_thread():
    """One torch thread for the test (tests/helpers.py: `threads`)."""
    from helpers import threads

    with threads(1):
        yield


@pytest.fixture
def cache_dir(tmp_path):
    """PHASEFIX_CACHE in the test's temporary directory (tests/helpers.py: `cache_dir`)."""
    from helpers import cache_dir as swap

    with swap(tmp_path / "cache") as path:
        yield path
