"""Command lines and config files from the ``run_config`` dataclasses.

``parser(Config, prog, description)`` makes the argparse parser of a command: one flag per option,
its help, type, choices from the option's field metadata, and ``--config FILE``. The options are
``leaves(Config)``: its fields, and the fields of the dataclasses its ``section`` fields hold
(``routing``: ``RoutingOptions``), flat, each by its own name. ``parse(Config, parser,
argv)`` resolves a command line into a ``Config``: the field defaults, then the ``--config`` file
(YAML ``.yaml``/``.yml`` or TOML ``.toml``; its keys are the flag names without ``--``, with ``-``
or ``_``), then the flags given, each checked as its flag is. An unknown key is refused naming the
closest valid one. ``write(cfg, path)`` writes the resolved config as YAML that ``--config`` reads
back (``probmoe-train`` puts it into the run folder as ``config.yaml``); ``flat(cfg)`` is every
option by name (the resume fingerprint's source, ``resume_keys``).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import time
from dataclasses import dataclass, fields

CONFIG_SUFFIXES = (".yaml", ".yml", ".toml")
RANK_ERROR_WAIT_S = 10.0  # how long a rank other than 0 waits for rank 0 to say an input error


@dataclass(frozen=True)
class Leaf:
    """One option of a config: its ``field`` (of the config, or of a section's dataclass), the
    config's field holding it (``section``, None at the top), its default and help section in this
    config, and whether it is in the resume fingerprint."""

    field: object
    section: str | None
    default: object
    group: str | None
    resume: bool

    @property
    def name(self) -> str:
        """The option's name: its flag without ``--``, a config-file key, a fingerprint field."""
        return self.field.metadata.get("name") or self.field.name


def leaves(config_cls) -> list[Leaf]:
    """Every option of ``config_cls``, in field order, a section's fields in its place."""
    out = []
    for f in fields(config_cls):
        meta = f.metadata
        if meta.get("section") is None:
            out.append(Leaf(f, None, f.default, meta.get("group"), bool(meta.get("resume"))))
            continue
        for g in fields(meta["section"]):
            if meta["training"] or not g.metadata.get("training"):
                default = meta["defaults"].get(g.name, g.default)
                group, resume = meta["group"] or g.metadata.get("group"), meta["resume"] or g.metadata.get("resume")
                out.append(Leaf(g, f.name, default, group, bool(resume)))
    return out


def build(config_cls, values: dict):
    """The ``config_cls`` of {option name: value} (the others: their defaults); ValueError from the
    configs' checks, naming the option."""
    top, sections = {}, {}
    for leaf in leaves(config_cls):
        if leaf.name in values:
            (sections.setdefault(leaf.section, {}) if leaf.section else top)[leaf.field.name] = values[leaf.name]
    for f in fields(config_cls):
        if f.metadata.get("section") is not None:
            top[f.name] = f.metadata["section"](**{**f.metadata["defaults"], **sections.get(f.name, {})})
    return config_cls(**top)


def flat(cfg) -> dict:
    """{option name: value} of a config, its sections' options included."""
    return {
        leaf.name: getattr(getattr(cfg, leaf.section) if leaf.section else cfg, leaf.field.name)
        for leaf in leaves(type(cfg))
    }


def section_values(cfg, section: str) -> dict:
    """{option name: value} of the options of ``cfg``'s ``section`` that its command has as flags."""
    return {
        leaf.name: getattr(getattr(cfg, section), leaf.field.name)
        for leaf in leaves(type(cfg))
        if leaf.section == section
    }


def resume_keys(config_cls) -> tuple[str, ...]:
    """The options marked ``resume`` (``run_config.trajectory``, or a section of them)."""
    return tuple(leaf.name for leaf in leaves(config_cls) if leaf.resume)


def _choices(meta):
    """A field's allowed words on the command line: its ``choices``, and its ``none`` word first."""
    if meta.get("choices") is None:
        return None
    return (meta["none"], *meta["choices"]) if meta.get("none") else tuple(meta["choices"])


def _none(meta, value):
    """The value of a field's word: None for its ``none`` word (``--balance none``)."""
    return None if meta.get("none") and value == meta["none"] else value


def flag(f) -> str:
    """The flag of a config field: ``--max-steps`` for ``max_steps`` unless its metadata names another."""
    return f.metadata.get("flag") or "--" + (f.metadata.get("name") or f.name).replace("_", "-")


def _key(text: str) -> str:
    return text.lstrip("-").replace("_", "-")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr, with a pointer to ``--help`` instead
    of the usage block, and exit status 2. Under torchrun every rank checks the same input: rank 0
    alone prints the line (``probmoe-launch`` ends with status 2 and nothing more)."""

    flags: dict = {}  # {field name: flag}: how the messages of the Python API (patch_model) name them

    def error(self, message: str):
        text = as_flags(" ".join(str(message).split()), self.flags)
        line = f"{self.prog}: error: {text} (see {self.prog} --help)\n"
        if os.environ.get("RANK", "0") != "0":
            # Rank 0 says the line. Ending first would make torchrun stop rank 0 (SIGTERM) before it
            # has: so wait for it, a few seconds at most (torchrun stops this rank once rank 0 ends)
            time.sleep(RANK_ERROR_WAIT_S)
            self.exit(2)
        self.exit(2, line)


def as_flags(message: str, flags: dict) -> str:
    """``message`` with the Python API's argument names as the command's flags: ``balance='aux-free'``
    becomes ``--balance aux-free``, ``balance_rate`` ``--balance-rate`` (names with an underscore, or
    followed by ``=``; text in quotes, such as a path, is left as it is)."""
    if not flags:
        return message
    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    assign = re.compile(rf"\b({names})=(?:'([^']*)'|([^\s,;)]+))")
    bare = re.compile(rf"(?<![\w-])({'|'.join(re.escape(n) for n in flags if '_' in n) or '(?!)'})(?![\w-])")
    parts = re.split(r"('[^']*')", assign.sub(lambda m: f"{flags[m.group(1)]} {m.group(2) or m.group(3)}", message))
    return "".join(part if i % 2 else bare.sub(lambda m: flags[m.group(1)], part) for i, part in enumerate(parts))


def parser(config_cls, prog: str, description: str) -> Parser:
    """The parser of a command whose options are ``config_cls``'s fields. Its defaults are left out
    of the namespace (``argparse.SUPPRESS``): ``parse`` tells what the command line gave from what
    the file or the defaults give. Errors are one line (``Parser``)."""
    p = Parser(prog=prog, description=description, argument_default=argparse.SUPPRESS)
    p.flags = {leaf.name: flag(leaf.field) for leaf in leaves(config_cls)}
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a YAML (.yaml, .yml) or TOML (.toml) file setting any of these "
        "options, keys named as the flags (max-steps: 200); flags given here override it",
    )
    groups, exclusive = {}, {}
    for leaf in sorted(leaves(config_cls), key=lambda leaf: bool(leaf.group)):  # help sections after the rest
        f, meta = leaf.field, leaf.field.metadata
        target = p
        if leaf.group:
            if leaf.group not in groups:
                groups[leaf.group] = p.add_argument_group(leaf.group)
            target = groups[leaf.group]
        if meta.get("exclusive"):
            if meta["exclusive"] not in exclusive:
                exclusive[meta["exclusive"]] = target.add_mutually_exclusive_group()
            target = exclusive[meta["exclusive"]]
        help = meta.get("help") or ""
        if leaf.default is not None and not isinstance(leaf.default, bool) and "default" not in help:
            help = f"{help} (default {leaf.default})".lstrip()
        if meta.get("required"):
            help += " (required: here or in --config)"
        kwargs = {"dest": leaf.name, "help": help or None}
        if meta.get("switch"):
            kwargs["action"] = "store_false" if meta.get("negate") else "store_true"
        else:
            kwargs["action"] = "append" if meta.get("append") else "store"
            for name, value in (
                ("type", meta.get("type")),
                ("choices", _choices(meta)),
                ("metavar", meta.get("metavar")),
            ):
                if value is not None:
                    kwargs[name] = value
        olds = [f"--{old.replace('_', '-')}" for old in meta.get("old", ())]  # an option's old names (as aliases)
        target.add_argument(flag(f), *olds, **kwargs)
    return p


def read_file(path: str) -> dict:
    """The mapping in a YAML or TOML config file; ValueError naming the file when it is not one."""
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in CONFIG_SUFFIXES:
        raise ValueError(f"--config {path!r}: must end in {', '.join(CONFIG_SUFFIXES)} (YAML or TOML)")
    if not os.path.isfile(path):
        raise ValueError(f"--config {path!r}: no such file")
    with open(path, "rb") as f:
        raw = f.read()
    try:
        import tomllib  # Python 3.11+
    except ImportError:
        tomllib = None
    if suffix == ".toml" and tomllib is None:
        raise ValueError(f"--config {path!r}: TOML needs Python 3.11 or later (tomllib); use YAML")
    try:
        if suffix == ".toml":
            values = tomllib.loads(raw.decode("utf-8"))
        else:
            import yaml

            values = yaml.safe_load(raw.decode("utf-8"))
    except Exception as e:  # the parsers' own errors: yaml.YAMLError, tomllib.TOMLDecodeError, UnicodeDecodeError
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"--config {path!r}: not valid {'TOML' if suffix == '.toml' else 'YAML'}: {first}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ValueError(
            f"--config {path!r}: must hold a mapping of option names to values, got a {type(values).__name__}"
        )
    return values


def _from_file(leaf: Leaf, value, where: str):
    """A config-file value of option ``leaf``, checked as its flag checks the command line's."""
    meta = leaf.field.metadata
    if value is None:
        if leaf.default is not None and not meta.get("switch"):
            raise ValueError(f"{where}: must be set (null is allowed only where the default is unset)")
        return leaf.default
    if meta.get("switch"):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: must be true or false, got {value!r}")
        return not value if meta.get("negate") else value
    if meta.get("append"):
        items = value if isinstance(value, list) else [value]
        if not all(isinstance(v, str) for v in items):
            raise ValueError(f"{where}: must be a string or a list of strings, got {value!r}")
        return items
    if isinstance(value, (dict, list, bool)):
        raise ValueError(f"{where}: must be a {'number' if meta.get('type') else 'string'}, got {value!r}")
    text = str(value)
    if meta.get("type") is not None:
        try:
            value = meta["type"](text)
        except argparse.ArgumentTypeError as e:
            raise ValueError(f"{where}: {e}") from None
    else:
        value = text
    choices = _choices(meta)
    if choices is not None and value not in choices:
        raise ValueError(f"{where}: invalid choice {value!r} (choose from {', '.join(map(str, choices))})")
    return _none(meta, value)


def file_values(config_cls, path: str) -> dict:
    """{field name: value} set by the config file ``path``; ValueError naming an unknown key and the
    closest valid one, or a value its flag would refuse."""
    by_key = {_key(flag(leaf.field)): leaf for leaf in leaves(config_cls)}
    by_key.update({_key("--" + old): leaf for leaf in leaves(config_cls) for old in leaf.field.metadata.get("old", ())})
    values, exclusive = {}, {}
    for key, value in read_file(path).items():
        name = _key(str(key))
        if name not in by_key:
            close = difflib.get_close_matches(name, list(by_key), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(by_key))}"
            raise ValueError(f"--config {path!r}: unknown key {key!r}{hint}")
        leaf = by_key[name]
        if leaf.name in values:
            raise ValueError(f"--config {path!r}: {key!r} is set twice (as {name} and {name.replace('-', '_')})")
        values[leaf.name] = _from_file(leaf, value, f"--config {path!r}: {key}")
        group = leaf.field.metadata.get("exclusive")
        if group and values[leaf.name] is not None:
            if group in exclusive:
                raise ValueError(f"--config {path!r}: {exclusive[group]} and {name} cannot both be set")
            exclusive[group] = name
    return values


def parse(config_cls, p: argparse.ArgumentParser, argv=None):
    """The ``config_cls`` a command line asks for: defaults < ``--config`` file < flags. Bad input
    exits through ``p.error`` (status 2, one line)."""
    given = vars(p.parse_args(argv))
    path = given.pop("config", None)
    try:
        values = file_values(config_cls, path) if path is not None else {}
    except ValueError as e:
        p.error(str(e))
    by_name = {leaf.name: leaf.field for leaf in leaves(config_cls)}
    for name in given:  # a flag replaces the file's value, and the file's choice in its exclusive group
        group = by_name[name].metadata.get("exclusive")
        if group:
            for other, f in by_name.items():
                if f.metadata.get("exclusive") == group:
                    values.pop(other, None)
    values.update({name: _none(by_name[name].metadata, value) for name, value in given.items()})
    missing = [flag(f) for name, f in by_name.items() if f.metadata.get("required") and values.get(name) is None]
    if missing:
        p.error(f"the following arguments are required: {', '.join(missing)}")
    try:
        return build(config_cls, values)
    except ValueError as e:  # a config's own checks (the options' checks that span several)
        p.error(str(e))


def as_file(cfg) -> dict:
    """``cfg`` as config-file keys (the flag names) and values: what ``--config`` reads back into ``cfg``."""
    values = flat(cfg)
    out = {}
    for leaf in leaves(type(cfg)):
        value = values[leaf.name]
        out[_key(flag(leaf.field))] = not value if leaf.field.metadata.get("negate") else value
    return out


def write(cfg, path: str) -> None:
    """The resolved ``cfg`` as YAML at ``path`` (written whole, then renamed into place)."""
    import yaml

    text = "# the resolved options of this run (--config reads this file back)\n" + yaml.safe_dump(
        as_file(cfg), sort_keys=False, allow_unicode=True
    )
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
