"""The `uq` subcommands of this family: `uq demo`, `uq eval shared-autonomy`, `uq eval help`.

setup.py registers each name below as one ``uq.commands`` entry point; each fills the
argparse parser of its subcommand.
"""

from uq_eval.closed_loop.demo import configure as demo
from uq_eval.closed_loop.help_eval import configure as eval_help
from uq_eval.closed_loop.shared_autonomy_eval import configure as eval_shared_autonomy

__all__ = ['demo', 'eval_shared_autonomy', 'eval_help']
