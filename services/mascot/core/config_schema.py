"""The JSON Schema of the Helm chart's MascotConfig overrides, generated from :class:`mascot.core.config.MascotConfig`.

The chart (helm/mascot) merges the values ``config`` and ``<component>.config`` (gateway, controlPlane, director,
speaker, judge, reward) into each component's MascotConfig file. values.schema.json checks them with the definition
``mascotConfig``, written by this module from ``MascotConfig.model_json_schema()`` made fit for overrides:

- every object with ``properties`` accepts no other key (``additionalProperties: false``): a typo is refused at
  install instead of at the pod's start; free-form maps (``engine.adapters``) stay maps;
- nothing is required: the values only override what the chart and the defaults give;
- ``$ref`` and ``$defs`` are inlined (the schema then holds no reference outside the definition);
- titles, descriptions and defaults are dropped (defaults can depend on the machine, e.g. the temporary directory),
  and so is pydantic's non-standard ``format: path``.

Cross-field rules of the model (validators) stay in Python: the rendered files are validated by the model itself.

Run ``python -m mascot.core.config_schema`` after changing MascotConfig (``--check`` only reports whether the
checked-in schema is current, exit 1 if not).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: values.schema.json of the chart in this checkout (services/mascot/core -> the repository root).
VALUES_SCHEMA = Path(__file__).resolve().parents[3] / "helm" / "mascot" / "values.schema.json"
#: Name of the generated definition under the values schema's ``definitions``.
DEFINITION = "mascotConfig"
#: The values keys merged into MascotConfig: the shared ``config`` and each component's own.
CONFIG_KEYS: tuple[tuple[str, ...], ...] = (
    ("config",), ("gateway", "config"), ("director", "config"), ("speaker", "config"), ("judge", "config"),
    ("reward", "config"), ("controlPlane", "config"),
)
COMMAND = "python -m mascot.core.config_schema"
_DROPPED = frozenset({"title", "description", "default", "required", "examples"})


def _inline(node: Any, defs: dict[str, Any], seen: tuple[str, ...] = ()) -> Any:
    """``node`` with every ``#/$defs/<name>`` reference replaced by the strict schema of that definition."""
    if isinstance(node, list):
        return [_inline(n, defs, seen) for n in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    if "$ref" in node:
        ref = node["$ref"]
        name = ref.removeprefix("#/$defs/")
        if name == ref or name not in defs:
            raise ValueError(f"unsupported reference {ref!r} in the MascotConfig schema")
        if name in seen:
            raise ValueError(f"recursive definition {name!r} in the MascotConfig schema cannot be inlined")
        out.update(_inline(defs[name], defs, (*seen, name)))
    for key, value in node.items():
        if key in ("$ref", "$defs") or key in _DROPPED or (key == "format" and value == "path"):
            continue
        if key == "properties":
            out[key] = {name: _inline(sub, defs, seen) for name, sub in value.items()}
        else:
            out[key] = _inline(value, defs, seen)
    if "properties" in out:
        out["additionalProperties"] = False
    return out


def config_schema() -> dict[str, Any]:
    """The strict override schema of MascotConfig (a draft-07 object schema without references)."""
    from mascot.core.config import MascotConfig

    raw = MascotConfig.model_json_schema()
    schema = _inline(raw, raw.get("$defs", {}))
    return {"$comment": f"Generated from mascot.core.config.MascotConfig by `{COMMAND}`; do not edit.", **schema}


def updated_values_schema(values_schema: dict[str, Any]) -> dict[str, Any]:
    """``values_schema`` (the chart's values.schema.json) with ``definitions.mascotConfig`` regenerated and every
    values key merged into MascotConfig referring to it."""
    out = json.loads(json.dumps(values_schema))
    out.setdefault("definitions", {})[DEFINITION] = config_schema()
    ref = {"$ref": f"#/definitions/{DEFINITION}"}
    for path in CONFIG_KEYS:
        node = out
        for key in path[:-1]:
            node = node["properties"][key]
        node["properties"][path[-1]] = dict(ref)
    return out


def dumps(schema: dict[str, Any]) -> str:
    """The file text of a values schema (2-space JSON, as checked in)."""
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Rewrite the MascotConfig part of values.schema.json; ``--check``: exit 1 when it is not current."""
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--schema", type=Path, default=VALUES_SCHEMA, help="values.schema.json to update")
    parser.add_argument("--check", action="store_true", help="only report whether the file is current")
    args = parser.parse_args(argv)
    text = args.schema.read_text(encoding="utf-8")
    new = dumps(updated_values_schema(json.loads(text)))
    if new == text:
        print(f"{args.schema}: the MascotConfig schema is current")
        return 0
    if args.check:
        print(f"{args.schema}: the MascotConfig schema is out of date; run `{COMMAND}`", file=sys.stderr)
        return 1
    args.schema.write_text(new, encoding="utf-8")
    print(f"{args.schema}: the MascotConfig schema was regenerated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
