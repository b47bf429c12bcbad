"""What the registry's models share: the frozen model that refuses unknown fields, a DDL
schema string and an Airflow connection id, as the registry file spells them."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = ["CONN_ID", "DDLSchema", "Model", "schema_columns", "schema_fields"]


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# An Airflow connection id: what Airflow's own forms and AIRFLOW_CONN_<ID> variables take.
CONN_ID = r"^[A-Za-z0-9_]+$"


def _ddl(value: str) -> str:
    schema_columns(value)
    return value


DDLSchema = Annotated[str, AfterValidator(_ddl)]
"""A DDL schema string (``"a STRING, b TIMESTAMP"``), checked when the registry loads."""


def schema_columns(ddl: str) -> list[str]:
    """Top-level column names of a DDL schema string (``"a STRING, b STRUCT<x: INT>"``)."""
    return [name for name, _ in schema_fields(ddl)]


def schema_fields(ddl: str) -> list[tuple[str, str]]:
    """Top-level (name, upper-case type) pairs of a DDL schema string."""
    parts, depth, current = [], 0, []
    for ch in ddl:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    fields = []
    for part in parts:
        m = re.fullmatch(r"\s*`?([A-Za-z_][A-Za-z0-9_]*)`?\s*:?\s+(\S.*?)\s*", part)
        if not m or depth != 0:
            raise ValueError(f"not a DDL schema (expected 'name TYPE, ...'): {ddl!r}")
        fields.append((m.group(1), " ".join(m.group(2).upper().split())))
    return fields
