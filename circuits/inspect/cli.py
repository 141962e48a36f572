"""Command-line entry points ``probmoe-compile`` and ``probmoe-inspect`` (see pyproject.toml).

Both take one circuit:

    --n N --k K                 ExactlyK(N, K)
    --n N --kmin A --kmax B     RangeK(N, A, B) (--kmin defaults to 0, --kmax to N)
    ... --groups G --max-groups M   GroupLimited: the K (or A..B) from at most M of G groups
    ... --groups G --capacity C     GroupCapacity: at most C per group (both limits together:
                                    GroupLimited with a capacity); --groups takes a count of
                                    equal groups or a comma-separated list of sizes
    --cnf FILE                  a DIMACS CNF (compiled by d4, the ``cnf`` extra)
    --sdd FILE --vtree FILE     an SDD saved by pysdd / libsdd
    --spec JSON                 any registered kind by its JSON form (``circuits.spec_from_dict``,
                                the "spec" that --json prints), e.g. '{"type": "ExactlyK", "n": 64, "k": 8}'
    --entry DIR                 (inspect only) a cache entry directory, read as it is

``--compiler`` picks another compiler than the spec's default (``circuits.compiler.compile``): ``pysdd``
for a counting spec or a CNF (its cache entry holds the SDD files too). ``--cache-dir`` moves the
whole cache, the compiled circuits and the native libraries built for the evaluator alike (it sets
``PROBMOE_CACHE`` for the process).

A counting circuit whose estimated compile cost passes the size limit (``circuits.compiler.estimate``:
``MAX_STEPS``, about 20 s on a 2-core AMD EPYC) is refused before any compiling, naming the
estimate; ``--force`` compiles it anyway (and recompiles it if cached). A long compile shows
progress bars on stderr. A CNF has no estimate: d4 runs in a child process, which Ctrl-C stops
at once and ``--time-limit SECONDS`` bounds.

Exit status: 0 done, 1 the circuit could not be compiled (or ran past --time-limit), 2 bad
arguments or a circuit past the size limit, 130 Ctrl-C. Errors and cache warnings are one line each
on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import sys
import warnings
from pathlib import Path

from ..compiler import file_checks
from ..compiler.cache import CacheWarning, read_entry
from ..compiler.cnf import MissingExtra, TimeLimit
from ..compiler.compile import COMPILERS, check_compiler, compile_entry
from ..compiler.estimate import MAX_STEPS, CircuitTooLarge
from ..spec import CnfFile, ExactlyK, GroupCapacity, GroupLimited, RangeK, SddFile, spec_from_dict
from .report import compile_facts, render_compile
from .text import render_text, to_dot

# The spec constructors name their fields in ValueError messages; the user typed flags.
_FLAG = {
    "n": "--n",
    "k": "--k",
    "kmin": "--kmin",
    "kmax": "--kmax",
    "sdd": "--sdd",
    "vtree": "--vtree",
    "path": "--cnf",
    "compiler": "--compiler",
    "groups": "--groups",
    "max_groups": "--max-groups",
    "capacity": "--capacity",
}
_EXAMPLE = '{"type": "ExactlyK", "n": 64, "k": 8}'  # a --spec
_FORMATS = {".png": "png", ".svg": "svg", ".dot": "dot", ".gv": "dot", ".txt": "text"}


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr (no usage block), exit status 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _parser(prog: str, description: str) -> _Parser:
    p = _Parser(prog=prog, description=description)
    g = p.add_argument_group("circuit (one of)")
    g.add_argument("--n", type=int, metavar="N", help="number of variables (N >= 1)")
    g.add_argument("--k", type=int, metavar="K", help="exactly K of N are true (0 <= K <= N)")
    g.add_argument("--kmin", type=int, metavar="A", help="at least A are true (0 <= A <= kmax; default 0)")
    g.add_argument("--kmax", type=int, metavar="B", help="at most B are true (A <= B <= N; default N)")
    g.add_argument(
        "--groups",
        type=_groups,
        metavar="G",
        help="contiguous groups of the N variables: G equal groups, or sizes 'a,b,...' summing to N "
        "(with --max-groups and/or --capacity)",
    )
    g.add_argument(
        "--max-groups",
        type=int,
        metavar="M",
        help="the true variables lie in at most M groups (1 <= M <= number of groups)",
    )
    g.add_argument(
        "--capacity", type=int, metavar="C", help="at most C true variables per group (1 <= C <= largest group)"
    )
    g.add_argument(
        "--cnf",
        metavar="FILE",
        help="a DIMACS CNF file (compiled by d4 into a d-DNNF, the 'cnf' extra; --compiler pysdd: an SDD)",
    )
    g.add_argument("--sdd", metavar="FILE", help="an SDD file saved by pysdd/libsdd (needs --vtree)")
    g.add_argument("--vtree", metavar="FILE", help="the vtree file the --sdd was saved with")
    g.add_argument(
        "--spec",
        metavar="JSON",
        help="any constraint kind by its JSON form, as --json prints it without 'describe', e.g. "
        '\'{"type": "RangeK", "n": 64, "kmin": 4, "kmax": 8}\' (kinds with file digests: --cnf, --sdd)',
    )
    p.add_argument(
        "--compiler",
        choices=COMPILERS,
        help="direct (default for --n ...: the count tree built directly), d4 (default for --cnf: the "
        "d-DNNF compiler, the 'cnf' extra) or pysdd (an SDD; slow on large CNFs)",
    )
    p.add_argument(
        "--time-limit",
        type=_seconds,
        metavar="SECONDS",
        help="stop d4 on a --cnf after this many seconds (> 0; default: no limit; Ctrl-C stops it too): "
        "the size estimate bounds counting circuits, not CNF files",
    )
    p.add_argument(
        "--cache-dir",
        metavar="DIR",
        help="cache root for compiled circuits and native libraries (default: $PROBMOE_CACHE, else "
        "$XDG_CACHE_HOME/probmoe, else ~/.cache/probmoe)",
    )
    return p


@contextlib.contextmanager
def _cache_root(args):
    """--cache-dir moves the whole cache while the command runs, native libraries included (they
    read PROBMOE_CACHE); the environment is restored afterwards (for callers in the same process)."""
    if args.cache_dir is None:
        yield
        return
    old = os.environ.get("PROBMOE_CACHE")
    os.environ["PROBMOE_CACHE"] = os.path.abspath(os.path.expanduser(args.cache_dir))
    try:
        yield
    finally:
        if old is None:
            del os.environ["PROBMOE_CACHE"]
        else:
            os.environ["PROBMOE_CACHE"] = old


def _seconds(text: str) -> float:
    """--time-limit: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def _groups(text: str):
    """--groups: an int (that many equal groups) or comma-separated group sizes."""
    try:
        sizes = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be a number of equal groups or comma-separated sizes, got {text!r}"
        ) from None
    return sizes[0] if len(sizes) == 1 else sizes


def _spec(p: _Parser, args, entry: bool = False):
    """The spec the flags name, or None for ``--entry``; bad flags end in ``p.error`` (exit 2)."""
    grouping = [getattr(args, a) is not None for a in ("groups", "max_groups", "capacity")]
    counting = any(getattr(args, a) is not None for a in ("n", "k", "kmin", "kmax")) or any(grouping)
    chosen = [
        counting,
        args.cnf is not None,
        args.sdd is not None or args.vtree is not None,
        args.spec is not None,
        entry and args.entry is not None,
    ]
    if sum(chosen) != 1:
        what = "--n with --k or --kmin/--kmax, or --cnf FILE, or --sdd FILE --vtree FILE, or --spec JSON"
        p.error(
            ("give only one circuit: " if sum(chosen) else "give a circuit: ")
            + what
            + (", or --entry DIR" if entry else "")
        )
    if entry and args.entry is not None:
        return None
    if args.spec is not None:
        try:
            data = json.loads(args.spec)
        except json.JSONDecodeError as exc:
            p.error(f"--spec must be a JSON object such as '{_EXAMPLE}', got {args.spec!r} ({exc.msg})")
        try:
            spec = spec_from_dict(data)
        except ValueError as exc:
            p.error(f"--spec: {exc}")
    elif counting:
        if args.n is None:
            p.error("--n is required with --k/--kmin/--kmax (N >= 1)")
        if args.k is not None and (args.kmin is not None or args.kmax is not None):
            p.error("--k cannot be combined with --kmin/--kmax: give --k K (0 <= K <= N) or a range")
        if args.k is None and args.kmin is None and args.kmax is None:
            p.error("give --k K (0 <= K <= N) or a range --kmin A --kmax B (0 <= A <= B <= N)")
        if any(grouping) and (args.groups is None or not any(grouping[1:])):
            p.error("group limits need --groups G and at least one of --max-groups M, --capacity C")
    else:
        if (args.sdd is None) != (args.vtree is None):
            p.error("--sdd and --vtree must be given together")
        try:  # libsdd would exit or crash on a malformed file: check it here first
            if args.cnf is not None:
                file_checks.check_dimacs(args.cnf)
            else:
                file_checks.check_sdd_pair(args.sdd, args.vtree)
        except ValueError as exc:
            p.error(f"{'--cnf' if args.cnf is not None else '--sdd/--vtree'}: {exc}")
    try:
        if args.spec is None:
            spec = _build_spec(args, counting)
        compiler = check_compiler(spec, args.compiler)
    except ValueError as exc:
        name, _, rest = str(exc).partition(" ")
        p.error(f"{_FLAG.get(name, name)} {rest}")
    if args.time_limit is not None and compiler != "d4":
        p.error(
            f"--time-limit applies to --cnf compiled by d4 (the default), not to compiler {compiler!r}: the size "
            "estimate bounds counting circuits, and pysdd runs where it cannot be stopped"
        )
    return spec


def _build_spec(args, counting: bool):
    """The spec of the (checked) flags; the spec constructors raise ValueError for bad values."""
    if args.groups is not None:
        sizes = {"kmin": args.kmin, "kmax": args.kmax}
        if args.max_groups is not None:
            return GroupLimited(args.n, args.k, args.groups, args.max_groups, capacity=args.capacity, **sizes)
        return GroupCapacity(args.n, args.k, args.groups, args.capacity, **sizes)
    if args.k is not None:
        return ExactlyK(args.n, args.k)
    if counting:
        return RangeK(args.n, 0 if args.kmin is None else args.kmin, args.n if args.kmax is None else args.kmax)
    if args.cnf is not None:
        return CnfFile(args.cnf)
    return SddFile(args.sdd, args.vtree)


@contextlib.contextmanager
def _stdout_to_stderr():
    """Send what libsdd prints on file descriptor 1 (e.g. "Read CNF: ...") to stderr meanwhile.

    Keeps stdout clean for ``--json`` and DOT. C's stdio buffer is flushed before fd 1 is restored.
    """
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        os.dup2(2, 1)
        yield
    finally:
        ctypes.CDLL(None).fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


_FORCE_HELP = (
    f"recompile, overwriting the cache entry; a counting circuit (--n ...) also past the size limit "
    f"(an estimated {MAX_STEPS:,} compile steps, about 20 s on a 2-core AMD EPYC), which refuses larger "
    f"ones otherwise (CNF and SDD files have no size limit: see --time-limit)"
)


def _compile(
    p: _Parser, spec, cache_dir, force: bool = False, compiler: str | None = None, time_limit: float | None = None
):
    """compile_entry with cache warnings printed as one line each; returns (entry, warnings).
    ``force``: recompile and lift the size limit; a circuit past it ends in exit status 2. Ctrl-C
    ends the command with one line and status 130 (nothing is cached: entries are renamed into
    place whole)."""
    with warnings.catch_warnings(record=True) as caught, _stdout_to_stderr():
        warnings.simplefilter("always", CacheWarning)
        try:
            entry = compile_entry(
                spec, cache_dir=cache_dir, force=force, size_limit=not force, compiler=compiler, time_limit=time_limit
            )
        except KeyboardInterrupt:
            p.exit(130, f"{p.prog}: interrupted (SIGINT) while compiling {spec.describe()}; nothing was cached\n")
        except TimeLimit as exc:
            p.exit(
                1,
                f"{p.prog}: error: d4 did not finish compiling {spec.describe()} within --time-limit "
                f"{exc.seconds:g} s and was stopped; nothing was cached\n",
            )
        except MissingExtra as exc:
            p.exit(1, f"{p.prog}: error: {_one_line(exc)}\n")
        except CircuitTooLarge as exc:
            p.exit(2, f"{p.prog}: error: {_one_line(exc.summary)}; pass --force to compile it anyway\n")
        except (ValueError, RuntimeError, OSError) as exc:
            p.exit(1, f"{p.prog}: error: could not compile {spec.describe()}: {_one_line(exc)}\n")
    notes = []
    for w in caught:
        if issubclass(w.category, CacheWarning):
            notes.append(_one_line(w.message))
            print(f"{p.prog}: warning: {notes[-1]}", file=sys.stderr)
        else:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    return entry, notes


def compile_main(argv: list[str] | None = None) -> int:
    """``probmoe-compile``: compile a circuit (or load it from the cache) and say what was built."""
    p = _parser(
        "probmoe-compile",
        "Compile a constraint into a probabilistic circuit, once; later runs load it from the disk cache.",
    )
    p.add_argument("--force", action="store_true", help=_FORCE_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = p.parse_args(argv)
    with _cache_root(args):
        spec = _spec(p, args)
        entry, notes = _compile(p, spec, args.cache_dir, args.force, args.compiler, args.time_limit)
        try:
            facts = compile_facts(entry, notes)
        except RuntimeError as exc:
            p.exit(1, f"{p.prog}: error: {_one_line(exc)}\n")
    sys.stdout.write(json.dumps(facts, indent=2) + "\n" if args.json else render_compile(facts))
    return 0


def inspect_main(argv: list[str] | None = None) -> int:
    """``probmoe-inspect``: show a compiled circuit as a text table, DOT, or a png/svg picture."""
    p = _parser(
        "probmoe-inspect",
        "Show a compiled circuit: its levels as text, its graph as DOT, "
        "or a picture (the whole circuit when small, a per-level summary when large).",
    )
    p.add_argument("--entry", metavar="DIR", help="a cache entry directory (instead of the circuit flags)")
    p.add_argument(
        "--format",
        choices=("text", "dot", "png", "svg"),
        help="what to show (default: from the --output suffix, else text)",
    )
    p.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout (required for png/svg)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--whole", action="store_true", help="draw / list every node, however large")
    size.add_argument("--summary", action="store_true", help="only the per-level summary, however small")
    p.add_argument("--force", action="store_true", help=_FORCE_HELP)
    args = p.parse_args(argv)
    with _cache_root(args):
        return _inspect(p, args)


def _inspect(p: _Parser, args) -> int:
    """The body of ``inspect_main`` once the arguments are parsed."""
    from ..circuit import Circuit  # torch: inspect draws through the evaluator; compile never loads it

    fmt = args.format or (_FORMATS.get(Path(args.output).suffix.lower(), "text") if args.output else "text")
    if fmt in ("png", "svg") and not args.output:
        p.error(f"--format {fmt} needs --output FILE")
    spec = _spec(p, args, entry=True)
    if spec is None and (args.force or args.time_limit is not None):
        p.error(
            f"{'--force compiles' if args.force else '--time-limit bounds compiling'} a circuit given by flags; "
            "--entry DIR is read as it is"
        )
    if spec is None:
        try:
            layout, manifest = read_entry(Path(args.entry))
        except ValueError as exc:
            p.error(f"--entry must be a valid cache entry directory: {args.entry!r}: {_one_line(exc)}")
        circuit = Circuit(layout, None, {**manifest, "cache_hit": True, "cache_path": str(Path(args.entry))})
    else:
        circuit = Circuit(*_compile(p, spec, args.cache_dir, args.force, args.compiler, args.time_limit)[0])
    whole = True if args.whole else False if args.summary else None
    try:
        if fmt in ("png", "svg"):
            from .draw import draw  # matplotlib is imported only when drawing

            kind = draw(circuit, args.output, fmt, whole)
            print(f"wrote {args.output} ({'whole circuit' if kind == 'whole' else 'per-level summary'}, {fmt})")
            return 0
        text = to_dot(circuit) if fmt == "dot" else render_text(circuit, whole)
        if args.output:
            Path(args.output).write_text(text, encoding="utf-8")
            print(f"wrote {args.output} ({fmt})")
        else:
            sys.stdout.write(text)
    except OSError as exc:
        p.exit(1, f"{p.prog}: error: cannot write {args.output!r} ({exc.strerror or _one_line(exc)})\n")
    return 0
