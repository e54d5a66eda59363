"""YAML for money inputs (price books, team maps): bounded, no aliases, no duplicate keys.

PyYAML's safe loader still expands aliases (a few hundred bytes of nested aliases make gigabytes:
the "billion laughs") and lets a repeated key silently replace the first one (`currency` twice, a
GPU model twice). A price book needs neither: both are refused here, with the dotted field and line.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_BYTES = 1 << 20  # a price book of every GPU model ever made is a few kB


class YamlRefused(ValueError):
    """Input refused: ``field`` (dotted path, or "(yaml)"/"(file)"), ``value`` and ``problem``."""

    def __init__(self, field_name: str, value: object, problem: str):
        self.field, self.value, self.problem = field_name, value, problem
        super().__init__(f"{field_name}: {problem} (value {value!r})")


class _NoAliasLoader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            mark = event.start_mark
            raise YamlRefused(
                "(yaml)",
                f"*{event.anchor}",
                f"aliases are not accepted (line {mark.line + 1} column {mark.column + 1}): write values out",
            )
        return super().compose_node(parent, index)


def load_yaml(raw: bytes | str, *, max_bytes: int = MAX_BYTES) -> Any:
    """Parse one YAML document strictly; raises YamlRefused naming the field and the value."""
    size = len(raw.encode("utf-8") if isinstance(raw, str) else raw)
    if size > max_bytes:
        raise YamlRefused("(file)", f"{size} bytes", f"larger than {max_bytes} bytes")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise YamlRefused("(file)", f"byte at offset {exc.start}", "not UTF-8 text") from None
    loader = _NoAliasLoader(raw)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "?"
            raise YamlRefused("(yaml)", where, f"malformed YAML: {getattr(exc, 'problem', exc)}") from None
        if node is None:
            return None
        _refuse_duplicate_keys(node, "")
        try:
            return loader.construct_document(node)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1} column {mark.column + 1}" if mark else "?"
            raise YamlRefused("(yaml)", where, f"malformed YAML: {getattr(exc, 'problem', exc)}") from None
    finally:
        loader.dispose()


def _refuse_duplicate_keys(node: yaml.Node, where: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key.value)
            field_name = f"{where}.{name}" if where else name
            if name in seen:
                raise YamlRefused(
                    field_name,
                    name,
                    f"duplicate key (line {key.start_mark.line + 1}; first at line {seen[name]})",
                )
            seen[name] = key.start_mark.line + 1
            _refuse_duplicate_keys(value, field_name)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _refuse_duplicate_keys(item, f"{where}[{i}]")
