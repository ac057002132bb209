"""MoeSpec: a model's MoE block as moekit reads it from the model's config.

The ops take the config.json text (their `spec` argument) and read it as transformers reads it
(moekit's load_spec rules: a key the file omits takes the default of the family's transformers
config class). MoeSpec holds that text, canonical (sorted keys) so one model gives one text, and
the fields moekit parsed from it (torch.ops.moekit.spec_summary).
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Union

import torch

ConfigLike = Union["MoeSpec", str, os.PathLike, Mapping[str, Any], Any]


@lru_cache(maxsize=None)
def summary(config_json: str) -> dict:
    """The parsed spec's fields of config.json text (cached per text)."""
    return json.loads(torch.ops.moekit.spec_summary(config_json))


def _config_dirs() -> list[Path]:
    here = Path(__file__).resolve().parent
    dirs = [here / "configs", here.parents[1] / "configs"]  # installed; the source tree
    if os.environ.get("MOEKIT_CONFIG_DIR"):
        dirs.insert(0, Path(os.environ["MOEKIT_CONFIG_DIR"]))
    return dirs


def _read_config(source: Union[str, os.PathLike]) -> dict:
    path = Path(source)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        for d in _config_dirs():
            named = d / f"{source}.json"
            if named.is_file():
                path = named
                break
        else:
            raise FileNotFoundError(
                f"moekit: {source!r} is neither a config.json (or a directory holding one) nor a "
                f"short name in {', '.join(str(d) for d in _config_dirs())}"
            )
    with open(path, encoding="utf-8") as f:
        return json.load(f)


class MoeSpec:
    """One model's MoE spec. Build it with MoeSpec.from_config(...)."""

    def __init__(self, config_json: str):
        self.json = config_json
        self.fields = summary(config_json)

    @classmethod
    def from_config(cls, config: ConfigLike, **overrides: Any) -> "MoeSpec":
        """From a config.json path (or its directory), a short name of configs/ ("deepseek-v3"),
        a dict of config.json's keys, or a transformers PretrainedConfig; `overrides` replace
        keys (e.g. num_hidden_layers=2)."""
        if isinstance(config, MoeSpec):
            if not overrides:
                return config
            d = json.loads(config.json)
        elif isinstance(config, Mapping):
            d = dict(config)
        elif isinstance(config, (str, os.PathLike)):
            d = _read_config(config)
        elif hasattr(config, "to_dict"):
            d = config.to_dict()
        else:
            raise TypeError(
                "moekit: expected a config.json path, a short name, a dict or a transformers "
                f"config, got {type(config).__name__}"
            )
        d.update(overrides)
        return cls(json.dumps(d, sort_keys=True, default=str))

    def __getattr__(self, name: str) -> Any:
        fields = self.__dict__.get("fields", {})
        if name in fields:
            return fields[name]
        raise AttributeError(f"MoeSpec has no field {name!r} (fields: {', '.join(fields)})")

    def __repr__(self) -> str:
        f = self.fields
        return (
            f"MoeSpec({f['model_type']}: H={f['hidden']} E={f['num_experts']} k={f['top_k']} "
            f"I={f['expert_intermediate']} {f['scoring']} {f['activation']} "
            f"shared={f['shared_kind']})"
        )


def as_spec(spec: ConfigLike) -> MoeSpec:
    return spec if isinstance(spec, MoeSpec) else MoeSpec.from_config(spec)
