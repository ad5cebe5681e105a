"""Compressed attention (science.md §2), three implementations of one signature
`compressed_attention(q, k, v, k_cmp, v_cmp, *, stride, local_window, local_memory, sink, scale, grid_offset,
query_block)`:

- `naive`: dense masked softmax over [T, T + N], O(T^2) memory; the readable reference and the ground truth of the
  tests (float64);
- `blocked`: the fast CPU path (query blocks, chunked raw band, a hand-written backward), O(T (N + L)) scores;
- `triton`: FlashAttention-style kernels (forward and backward), the CUDA path.

Import the one you need: `naive` and `triton` need only torch (and triton), `blocked` uses the grid helpers of
`phasefix.kernels.window_grid`.
"""
