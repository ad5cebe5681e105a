"""phasefix: study and fix phase sensitivity in language models with chunked KV-cache compression."""

__version__ = "0.1.0"
