"""The `uq` subcommands of this family: `uq bench mnist` and `uq data fetch`.

setup.py registers each name below as one ``uq.commands`` entry point; each fills the
argparse parser of its subcommand.
"""

from uq_eval.mnist.benchmark import configure as bench_mnist
from uq_eval.mnist.fetch_command import configure as data_fetch

__all__ = ['bench_mnist', 'data_fetch']
