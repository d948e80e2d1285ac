"""Config-driven pipelines: a TOML or JSON file that declares a whole pipeline.

`load_pipeline(path)` reads a file, `pipeline_from_dict(data)` takes the same structure
already parsed, and `config_schema()` is the JSON Schema of the format (what `turnplug
schema` prints). Every problem is reported at once in one `pipeline.ConfigError` whose lines
name the file and the path of each bad entry (``pre[2].tool: required``). The format is
described in ``docs/config.md``.
"""

from ._load import config_schema, load_pipeline, pipeline_from_dict

__all__ = ["config_schema", "load_pipeline", "pipeline_from_dict"]
