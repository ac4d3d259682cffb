"""The ``uq`` command line.

Like ros2cli's verbs, subcommands are contributed by the workspace's packages through the
``uq.commands`` entry-point group, so a package adds a command without touching this file.
An entry point's name is the command path with dots (``bench.gp`` is ``uq bench gp``); its
value is a function ``configure(parser)`` that adds the arguments and sets
``parser.set_defaults(run=callable)``, where ``run(args) -> int`` does the work.
Configure functions must stay cheap to import (heavy imports belong inside ``run``) so
that ``uq --help`` answers at once.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import EntryPoint, entry_points

ENTRY_POINT_GROUP = 'uq.commands'

_GROUP_HELP = {
    'bench': 'benchmarks that print JSON figures',
    'data': 'the benchmark datasets: download and check them',
    'eval': 'evaluate models and recordings',
    'gp': 'the NTK-GP of any detector: fit and calibrate it on your data',
    'labels': 'the ask-for-help label store',
    'sim': 'simulated world and synthetic data',
}


def _command_entry_points() -> list[EntryPoint]:
    return sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def _package_of(ep: EntryPoint) -> str:
    dist = getattr(ep, 'dist', None)
    return dist.name.replace('-', '_') if dist is not None else '(unknown package)'


def _commands_by_package(entry_points: Sequence[EntryPoint]) -> str:
    """The epilog of ``uq --help``: which workspace package contributes which command."""
    by_package: dict[str, list[str]] = {}
    for ep in entry_points:
        by_package.setdefault(_package_of(ep), []).append(ep.name.replace('.', ' '))
    lines = ['commands by package:']
    lines += [f'  {package}: {", ".join(names)}' for package, names in sorted(by_package.items())]
    return '\n'.join(lines)


def build_parser(commands: Sequence[EntryPoint] | None = None) -> argparse.ArgumentParser:
    """Build the argument parser with one nested subcommand per entry point."""
    entry_points = list(commands if commands is not None else _command_entry_points())
    parser = argparse.ArgumentParser(
        prog='uq',
        description='Uncertainty-gated perception and shared autonomy for ROS 2.',
        epilog=_commands_by_package(entry_points),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root = parser.add_subparsers(title='commands', metavar='COMMAND')
    groups: dict[tuple[str, ...], argparse._SubParsersAction] = {(): root}
    for ep in entry_points:
        path = tuple(ep.name.split('.'))
        for depth in range(1, len(path)):
            prefix = path[:depth]
            if prefix not in groups:
                name = prefix[-1]
                group_parser = groups[prefix[:-1]].add_parser(
                    name, help=_GROUP_HELP.get(name, f'{name} commands'))
                group_parser.set_defaults(run=_print_help_of(group_parser))
                groups[prefix] = group_parser.add_subparsers(
                    title=f'{name} commands', metavar='COMMAND')
        configure: Callable[[argparse.ArgumentParser], None] = ep.load()
        doc = (configure.__doc__ or '').strip().splitlines()
        sub = groups[path[:-1]].add_parser(
            path[-1], help=doc[0] if doc else None,
            formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        configure(sub)
    parser.set_defaults(run=_print_help_of(parser))
    return parser


def _print_help_of(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    def run(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2
    return run


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the selected subcommand; returns the process exit code."""
    args = build_parser().parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == '__main__':
    sys.exit(main())
