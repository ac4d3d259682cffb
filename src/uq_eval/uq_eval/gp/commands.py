"""The `uq` subcommands of this family: `uq gp fit` and `uq gp diagnose`.

setup.py registers each name below as one ``uq.commands`` entry point; each fills the
argparse parser of its subcommand.
"""

from uq_eval.gp.diagnose import configure as gp_diagnose
from uq_eval.gp.fit_command import configure as gp_fit

__all__ = ['gp_diagnose', 'gp_fit']
