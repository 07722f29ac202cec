"""The router's HTTP API as an OpenAPI 3.0 document, served at GET /openapi.json.

It describes what the router itself guarantees: the request fields it reads (the engine checks
the rest, so other fields pass through), the statuses it answers and the OpenAI error envelope
of every error. A schemathesis run (tests/e2e/test_router_openapi.py) checks a live router
against it: no 5xx, and every answer conforming to this document.
"""

from __future__ import annotations

from typing import Any

_ERROR = {"$ref": "#/components/schemas/Error"}
_JSON_ERROR = {"content": {"application/json": {"schema": _ERROR}}}


def _errors(*statuses: int) -> dict[str, Any]:
    text = {400: "Malformed request (bad JSON, invalid Unicode, nesting too deep, missing fields, "
                 "malformed HTTP).",
            404: "Unknown model or path.", 405: "Method not allowed.",
            408: "Request headers or body not received in time.", 413: "Body larger than the limit.",
            502: "The engine failed before the first byte.",
            503: "Routing tables not synced, no routable replica, or too many connections.",
            504: "The engine did not answer within the first-byte timeout."}
    return {str(s): {"description": text[s], **_JSON_ERROR} for s in statuses}


_GENERATION_ERRORS = _errors(400, 404, 408, 413, 502, 503, 504)

_COMMON_FIELDS: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1, "description": "The pool to route to."},
    "max_tokens": {"type": "integer", "minimum": 1, "nullable": True},
    "stream": {"type": "boolean", "description": "Answer as server-sent events."},
    "temperature": {"type": "number", "minimum": 0, "nullable": True},
    "top_p": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": 1, "nullable": True},
}

_MESSAGE = {
    "type": "object",
    "required": ["role"],
    "properties": {
        "role": {"type": "string", "enum": ["system", "user", "assistant", "tool", "developer"]},
        "content": {"nullable": True, "oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "object", "required": ["type", "text"], "properties": {
                "type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}},
        ]},
        "name": {"type": "string"},
    },
}

_COMPLETION = {
    "type": "object",
    "required": ["choices"],
    "properties": {
        "id": {"type": "string"},
        "object": {"type": "string"},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": {"type": "object"}},
        "usage": {"type": "object"},
    },
}


def _generation(summary: str, request_schema: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{request_schema}"}}}},
        "responses": {
            "200": {"description": "The engine's answer, streamed as it comes.", "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/Completion"}},
                # one schema per event: each `data:` line is a chunk, an error envelope or [DONE]
                "text/event-stream": {"schema": {"type": "object", "required": ["data"],
                                                 "properties": {"data": {"type": "string"}}}},
            }},
            **_GENERATION_ERRORS,
        },
    }}


def spec() -> dict[str, Any]:
    return {
        "openapi": "3.0.3",
        "info": {"title": "Tidegate router", "version": "1",
                 "description": "OpenAI-compatible front door of a Tidegate fleet. Every error answers "
                                "{\"error\": {\"message\", \"type\", \"param\", \"code\"}}."},
        "paths": {
            "/v1/chat/completions": _generation("Chat completion, routed to a replica of the model's pool.",
                                                "ChatRequest"),
            "/v1/completions": _generation("Text completion, routed to a replica of the model's pool.",
                                           "CompletionRequest"),
            "/v1/models": {"get": {"summary": "Pools with at least one replica.", "responses": {
                "200": {"description": "The models.", "content": {"application/json": {"schema": {
                    "type": "object", "required": ["object", "data"], "properties": {
                        "object": {"type": "string", "enum": ["list"]},
                        "data": {"type": "array", "items": {"type": "object", "required": ["id", "object"],
                                                            "properties": {"id": {"type": "string"},
                                                                           "object": {"type": "string"}}}}}}}}}}}},
            "/health": {"get": {"summary": "200 once the routing tables are synced, 503 before.", "responses": {
                "200": {"description": "Synced.", "content": {"application/json": {"schema": {
                    "$ref": "#/components/schemas/Health"}}}},
                "503": {"description": "Not synced yet.", "content": {"application/json": {"schema": {
                    "$ref": "#/components/schemas/Health"}}}}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics.", "responses": {
                "200": {"description": "Prometheus text format.", "content": {"text/plain": {
                    "schema": {"type": "string"}}}}}}},
            "/openapi.json": {"get": {"summary": "This document.", "responses": {
                "200": {"description": "OpenAPI 3.0.", "content": {"application/json": {
                    "schema": {"type": "object"}}}}}}},
        },
        "components": {"schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["message", "type", "param", "code"], "properties": {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": "string", "nullable": True},
                    # OpenAI: a string or null; vLLM (passed through from the engine): the HTTP status
                    "code": {"nullable": True, "oneOf": [{"type": "string"}, {"type": "integer"}]},
                }}}},
            "ChatRequest": {"type": "object", "required": ["model", "messages"], "properties": {
                **_COMMON_FIELDS,
                "messages": {"type": "array", "minItems": 1, "items": _MESSAGE},
            }},
            "CompletionRequest": {"type": "object", "required": ["model", "prompt"], "properties": {
                **_COMMON_FIELDS,
                "prompt": {"oneOf": [
                    {"type": "string"},
                    {"type": "array", "minItems": 1, "items": {"type": "string"}},
                    {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}},
                ]},
            }},
            "Completion": _COMPLETION,
            "Health": {"type": "object", "required": ["status", "synced"], "properties": {
                "status": {"type": "string", "enum": ["ok", "unsynced"]},
                "synced": {"type": "boolean"},
                "router_id": {"type": "string"},
                "etcd_healthy": {"type": "boolean"},
                "pools": {"type": "object"},
            }},
        }},
    }
