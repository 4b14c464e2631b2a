"""The OpenAI Responses API: request translation, input items, tools, the response objects and
event stream, the WebSocket transport, and `previous_response_id` read back from the records."""
