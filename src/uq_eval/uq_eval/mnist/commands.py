"""The `uq` subcommands of this family: `uq bench mnist`.

setup.py registers each name below as one ``uq.commands`` entry point; each fills the
argparse parser of its subcommand.
"""

from uq_eval.mnist.benchmark import configure as bench_mnist

__all__ = ['bench_mnist']
