"""The API surfaces the proxy speaks to a harness, one module (or sub-package) per API: each
turns its request body into the internal `Request` and renders `Result`s and `Delta`s in its own
wire format. Routes never see which surface a call came in through."""
