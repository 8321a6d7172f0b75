"""Turning pydantic's validation errors into errors that name the document and field."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from fairpool.sched.errors import ConfigError

Model = TypeVar("Model", bound=BaseModel)


def validate(model: type[Model], document: object, where: str) -> Model:
    """`model` from `document`; a ConfigError naming `where` and the first bad field."""
    try:
        return model.model_validate(document)
    except ValidationError as error:
        first = error.errors()[0]
        field = ".".join(str(part) for part in first["loc"]) or "document"
        raise ConfigError(f"{where}: {field}", first["msg"]) from None
