"""The tenant API's OpenAPI document, built from the request models the gateway validates
with (so the two cannot drift), served at `/openapi.json` and checked in as
`docs/openapi.json` (a test fails when the checked-in copy is stale)."""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fairpool_gateway.protocol import ENDPOINTS

ERROR_STATUSES = {
    "400": "The body is not valid JSON or a field is invalid (the error names it).",
    "401": "Missing or unknown API key.",
    "403": "The tenant may not use this model's pool.",
    "404": "No pool serves this model.",
    "413": "The request body is too large.",
    "429": "A hard limit or the fair queue refused the request; see Retry-After.",
    "502": "The model server failed.",
    "503": "No model server of the pool is available.",
}


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="allow")
    message: str = Field(description="What went wrong.")
    type: str = Field(description="Error class, e.g. invalid_request_error.")
    param: str | None = Field(default=None, description="The request field at fault.")
    code: str | int | None = Field(default=None, description="Machine-readable reason.")


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Model(BaseModel):
    id: str
    object: str
    created: int
    owned_by: str


class ModelList(BaseModel):
    object: str
    data: list[Model]


def _schemas() -> dict[str, Any]:
    schemas: dict[str, Any] = {}
    models: list[type[BaseModel]] = [api.request for api in ENDPOINTS]
    models += [ErrorResponse, ModelList]
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    return schemas


def _error_responses(statuses: list[str]) -> dict[str, Any]:
    return {
        status: {
            "description": ERROR_STATUSES[status],
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}
            },
        }
        for status in statuses
    }


def _generation(summary: str, request: str, streams: bool) -> dict[str, Any]:
    return {
        "post": {
            "summary": summary,
            "security": [{"apiKey": []}],
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{request}"}}
                },
            },
            "responses": {
                "200": {
                    "description": "The answer: a JSON object, or server-sent events when "
                    "`stream` is true, as the model server produced them."
                    if streams
                    else "The answer: a JSON object, as the model server produced it.",
                    "content": {
                        "application/json": {"schema": {"type": "object"}},
                        **(
                            {"text/event-stream": {"schema": {"type": "string"}}} if streams else {}
                        ),
                    },
                },
                **_error_responses(list(ERROR_STATUSES)),
            },
        }
    }


def _probe(summary: str) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "responses": {
                "200": {"description": "Yes.", "content": {"application/json": {}}},
                "503": {"description": "Not yet.", "content": {"application/json": {}}},
            },
        }
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "fairpool gateway: tenant API",
            "version": "v1",
            "description": "OpenAI-compatible chat completions, completions, responses and "
            "embeddings, served by a pool of model servers shared fairly among tenants. "
            "Authenticate with `Authorization: Bearer KEY`; the key decides the tenant.",
        },
        "paths": {
            **{
                api.path: _generation(api.summary, api.request.__name__, api.stream is not None)
                for api in ENDPOINTS
            },
            "/v1/models": {
                "get": {
                    "summary": "The models (pools) this tenant may use",
                    "security": [{"apiKey": []}],
                    "responses": {
                        "200": {
                            "description": "The models.",
                            "content": {
                                "application/json": {
                                    "schema": {"$ref": "#/components/schemas/ModelList"}
                                }
                            },
                        },
                        **_error_responses(["401"]),
                    },
                }
            },
            "/healthz": _probe("The gateway process is alive"),
            "/readyz": _probe("Every pool has a model server in rotation"),
        },
        "components": {
            "schemas": _schemas(),
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
    }


if __name__ == "__main__":  # `make openapi` writes docs/openapi.json with this
    import json

    print(json.dumps(openapi_document(), indent=2))
