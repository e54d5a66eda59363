"""YAML for money inputs (price books, team maps): bounded, no aliases, no duplicate keys.

PyYAML's safe loader still expands aliases (a few hundred bytes of nested aliases make gigabytes:
the "billion laughs") and lets a repeated key silently replace the first one (`currency` twice, a
GPU model twice). A price book needs neither: both are refused here, with the dotted field and line.

It also reads YAML 1.1, where ``1:30`` is the integer 90 (sexagesimal) and ``0x10`` is 16: here
numbers are decimal only, as YAML 1.2's core schema has them (yaml.org/spec/1.2.2 §10.3.2), so such
a value stays text and the price book refuses it as "not a number". A NUL byte and nesting deeper than MAX_DEPTH are
refused (PyYAML answered a traceback, RecursionError). Keys (model names, namespaces, teams) must be
names a person can tell apart (`refuse_confusable`, docs/billing.md §3.8).
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import yaml

MAX_BYTES = 1 << 20  # a price book of every GPU model ever made is a few kB
MAX_DEPTH = 16  # a price book nests 5 deep (versions[i].gpus.model.hourly_rate)


class YamlRefused(ValueError):
    """Input refused: ``field`` (dotted path, or "(yaml)"/"(file)"), ``value`` and ``problem``."""

    def __init__(self, field_name: str, value: object, problem: str):
        self.field, self.value, self.problem = field_name, value, problem
        super().__init__(f"{field_name}: {problem} (value {value!r})")


# Decimal numbers only: PyYAML's YAML 1.1 ones less sexagesimal (1:30), base 2, 8 and 16 (0b1, 017,
# 0x10) and underscores (1_000); 1e29 stays text, as in YAML 1.1, and the readers parse it exactly
_INT = re.compile(r"^[-+]?[0-9]+$")
_FLOAT = re.compile(
    r"^[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+][0-9]+)?$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$"
)


class _NoAliasLoader(yaml.SafeLoader):
    # PyYAML's resolvers, less its YAML 1.1 numbers (a class attribute, as PyYAML's own)
    yaml_implicit_resolvers = {  # type: ignore[misc]  # noqa: RUF012
        first: [
            (tag, rx)
            for tag, rx in resolvers
            if tag not in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
        ]
        for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }
    depth = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            mark = event.start_mark
            raise YamlRefused(
                "(yaml)",
                f"*{event.anchor}",
                f"aliases are not accepted (line {mark.line + 1} column {mark.column + 1}): write values out",
            )
        self.depth += 1
        if self.depth > MAX_DEPTH:
            mark = self.peek_event().start_mark
            raise YamlRefused(
                "(yaml)",
                f"line {mark.line + 1} column {mark.column + 1}",
                f"nested deeper than {MAX_DEPTH} levels",
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


_NoAliasLoader.add_implicit_resolver("tag:yaml.org,2002:int", _INT, list("-+0123456789"))
_NoAliasLoader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))


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
    if "\x00" in raw:
        raise YamlRefused("(file)", f"offset {raw.index(chr(0))}", "a NUL character; not a text file")
    try:
        loader = _NoAliasLoader(raw)
    except yaml.YAMLError as exc:  # the reader's own refusals (other unprintable characters)
        raise YamlRefused("(yaml)", "?", f"malformed YAML: {exc}") from None
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
        except (ValueError, OverflowError) as exc:  # PyYAML's readers raise these bare: 2026-13-01
            raise _unreadable_scalar(loader, node, exc) from None
    finally:
        loader.dispose()


def _unreadable_scalar(loader: yaml.SafeLoader, node: yaml.Node, exc: Exception) -> YamlRefused:
    """The refusal of the first scalar whose tag's reader fails (a date that is none, 2026-13-01),
    named by its place in the file and its text."""
    for scalar in _scalars(node):
        reader = type(loader)("")  # the failed loader holds the half-built document
        try:
            reader.construct_object(scalar)
        except (ValueError, OverflowError) as why:
            where = f"line {scalar.start_mark.line + 1} column {scalar.start_mark.column + 1}"
            kind = scalar.tag.rsplit(":", 1)[-1]
            return YamlRefused("(yaml)", scalar.value, f"{where}: not a valid {kind}: {why}")
        finally:
            reader.dispose()
    return YamlRefused("(yaml)", "?", f"malformed YAML: {exc}")


def _scalars(node: yaml.Node):
    if isinstance(node, yaml.ScalarNode):
        yield node
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            yield from _scalars(item)
    elif isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            yield from _scalars(key)
            yield from _scalars(value)


def _refuse_duplicate_keys(node: yaml.Node, where: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        looks: dict[str, str] = {}  # each key's skeleton -> the key
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else str(key.value)
            field_name = f"{where}.{name}" if where else name
            refuse_confusable(field_name, name)
            twin = looks.setdefault(skeleton(name), name)
            if twin != name:
                raise YamlRefused(
                    field_name, name, f"looks like the key {twin!r} (line {seen.get(twin, '?')})"
                )
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


# Letters of other scripts that render as Latin ones: a few of UTS #39's confusables.txt
# (unicode.org/Public/security/latest/confusables.txt), the Cyrillic and Greek capitals and small
# letters that GPU model names and Kubernetes names could be typed with.
_LOOKALIKES = str.maketrans(
    "АВЕКМНОРСТХаеорсухіјѕԁԛԝΑΒΕΖΗΙΚΜΝΟΡΤΥΧορνϲ",
    "ABEKMHOPCTXaeopcyxijsdqwABEZHIKMNOPTYXopvc",
)


def skeleton(name: str) -> str:
    """What ``name`` looks like: NFKC, look-alike letters as the Latin ones (case is the readers'
    own business: a price book matches models case-insensitively and says so itself)."""
    return unicodedata.normalize("NFKC", name).translate(_LOOKALIKES)


def _script(char: str) -> str:
    """A letter's script, from its Unicode name ("CYRILLIC CAPITAL LETTER EN"): Python's unicodedata
    has no script property; the name's first word is it for the alphabets names are typed in."""
    return unicodedata.name(char, "UNKNOWN").split()[0]


def refuse_confusable(field_name: str, name: str) -> None:
    """YamlRefused unless ``name`` is one a reader can tell from every other (UTS #39 in short): in
    NFKC form (no fullwidth letters, no NBSP), no invisible or control characters, letters of one
    script, and not a non-Latin twin of a Latin name (a Cyrillic "А100" for "A100")."""
    if not field_name.isprintable():  # shown escaped: the message goes to a terminal
        field_name = ascii(field_name)[1:-1]
    for char in name:
        category = unicodedata.category(char)
        if category[0] == "C" or (category == "Zs" and char != " ") or category in ("Zl", "Zp"):
            raise YamlRefused(field_name, name, f"holds the invisible or control character U+{ord(char):04X}")
    normal = unicodedata.normalize("NFKC", name)
    if normal != name:
        raise YamlRefused(field_name, name, f"not in Unicode NFKC form (it reads as {normal!r})")
    scripts = {_script(c) for c in name if c.isalpha()}
    if len(scripts) > 1:
        raise YamlRefused(field_name, name, f"mixes the scripts {', '.join(sorted(scripts))}")
    if not name.isascii() and skeleton(name).isascii():
        raise YamlRefused(field_name, name, f"looks like the Latin name {skeleton(name)!r}")
