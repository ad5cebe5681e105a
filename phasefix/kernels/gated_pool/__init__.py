"""Gated slot pooling: `naive` (the readable reference, torch only) and `triton` (its kernel), same signature
`gated_pool(payload, gate_logits)`. Import the one you need (`phasefix.kernels.gated_pool.triton` needs triton)."""
