"""DRF's JSON parser on Corridor's one inbound gate: bodies are decoded by
corridor/inbound.py ``loads`` (UTF-8, no lone surrogates, no NUL, no NaN/Infinity,
bounded depth and size), so hostile JSON is a 400 ``{"detail": ...}`` from DRF instead
of a 500 from psycopg or a RecursionError."""

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from corridor import inbound


class SafeJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        """The body as a JSON value; raises ParseError (400) with the gate's message."""
        raw = stream.read(inbound.MAX_BODY_BYTES + 1) if stream is not None else b""
        parser_context = parser_context or {}
        encoding = parser_context.get("encoding", settings.DEFAULT_CHARSET)
        if encoding.lower().replace("_", "-") not in ("utf-8", "utf8"):
            raise ParseError("JSON bodies must be UTF-8")
        try:
            return inbound.loads(raw)
        except inbound.InboundError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
