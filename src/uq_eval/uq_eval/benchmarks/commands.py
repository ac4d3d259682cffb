"""The `uq` subcommands of this family: `uq bench gp`, `uq bench node`, `uq bench arbitration`,
`uq bench backend`, `uq bench labels`.

setup.py registers each name below as one ``uq.commands`` entry point; each fills the
argparse parser of its subcommand.
"""

from uq_eval.benchmarks.arbitration import configure as bench_arbitration
from uq_eval.benchmarks.backend import configure as bench_backend
from uq_eval.benchmarks.gp import configure as bench_gp
from uq_eval.benchmarks.labels import configure as bench_labels
from uq_eval.benchmarks.node import configure as bench_node

__all__ = ['bench_gp', 'bench_node', 'bench_arbitration', 'bench_backend', 'bench_labels']
