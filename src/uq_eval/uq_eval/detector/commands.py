"""The `uq` subcommands of this family: `uq train`, `uq eval detector`, `uq eval detector-gp`,
`uq eval duplicates`, `uq eval tracks`, `uq eval layers`.

setup.py registers each name below as one ``uq.commands`` entry point; each fills the
argparse parser of its subcommand.
"""

from uq_eval.detector.duplicates_study import configure as eval_duplicates
from uq_eval.detector.evaluation import configure as eval_detector
from uq_eval.detector.gp_study import configure as eval_detector_gp
from uq_eval.detector.layer_study import configure as eval_layers
from uq_eval.detector.track_evaluation import configure as eval_tracks
from uq_eval.detector.train_command import configure as train

__all__ = ['train', 'eval_detector', 'eval_detector_gp', 'eval_duplicates', 'eval_tracks',
           'eval_layers']
