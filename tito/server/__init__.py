"""The HTTP gateway (Starlette), a thin layer over sessions, renderers and engines."""
