"""The `uq` subcommands of this family: `uq eval bag`, `uq sim record`, `uq replay`.

setup.py registers each name below as one ``uq.commands`` entry point; each fills the
argparse parser of its subcommand.
"""

from uq_eval.bags.command import configure as eval_bag
from uq_eval.bags.record import configure as sim_record
from uq_eval.bags.replay import configure as replay

__all__ = ['eval_bag', 'sim_record', 'replay']
