from .gated_pool import gated_pool
