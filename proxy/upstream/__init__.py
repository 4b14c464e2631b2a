"""Inference servers behind the proxy: vLLM's wire format, the keep-alive HTTP pool, the dialects
of hosted APIs, the ring of several upstreams with its health, and the weight push through them."""
