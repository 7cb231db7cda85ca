"""The ``r3rag`` command. Subcommands are entry points in the ``r3rag.commands`` group.

Each package registers its own (setup.py), so this dispatcher never imports reward_server or
eval. An entry point is a function ``add_parser(subparsers)`` that adds one subparser and sets
``func`` (taking the parsed args, returning an exit code). Heavy imports belong inside ``func``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from importlib.metadata import entry_points

from r3_env import __version__
from r3_env.allocator import keep_freed_memory

logger = logging.getLogger("r3rag")

# Errors a user can fix from the message alone: printed without a traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError, FileExistsError, PermissionError)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="r3rag", description="Train LLMs to reason and retrieve step by step.")
    parser.add_argument("--version", action="version", version=f"r3rag {__version__}")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    verbosity.add_argument("-v", "--verbose", action="store_true", help="log debug messages and error tracebacks")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for entry in sorted(entry_points(group="r3rag.commands"), key=lambda e: e.name):
        entry.load()(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except USER_ERRORS as error:
        logger.debug("%s failed", args.command, exc_info=True)
        print(f"r3rag {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"r3rag {args.command}: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """The ``r3rag`` executable: glibc's malloc tuned for PyTorch first (:mod:`r3_env.allocator`), then :func:`main`."""
    keep_freed_memory()
    sys.exit(main())


if __name__ == "__main__":
    run()
