"""Process-wide test setup, imported by pytest before any test module."""
import os

# Triton kernels run on CPU through the interpreter. The switch is read when `triton.language` and the kernels are
# decorated, so it must be set before the first test module that imports triton (transformers' DeepSeek-V4 does,
# through its own kernels) is collected, not only in test_kernels.py.
os.environ.setdefault("TRITON_INTERPRET", "1")
