"""Pydantic request bodies of every gateway route: they validate (a 400 naming the field, in
each API's own error shape) and they are the request bodies `/openapi.json` publishes."""
