"""Every place that lists the simulator's scenarios names all of them.

``uq_sim.scenario.SCENARIO_NAMES`` is the source; the launch file's own copy (launch files
import no workspace package), the sim camera's parameter file and the documents that list
the scenarios must name each one.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from uq_sim.scenario import SCENARIO_NAMES

WORKSPACE = Path(__file__).resolve().parents[1]


def test_the_sim_launch_file_accepts_every_scenario():
    tree = ast.parse((WORKSPACE / 'launch' / 'sim.launch.py').read_text(encoding='utf-8'))
    (value,) = [node.value for node in tree.body if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == 'SCENARIOS' for t in node.targets)]
    assert ast.literal_eval(value) == SCENARIO_NAMES


@pytest.mark.parametrize('path', ['config/sim_camera.yaml', 'docs/simulation.md',
                                  'docs/bag_evaluation.md'])
def test_each_list_of_scenarios_names_them_all(path):
    text = (WORKSPACE / path).read_text(encoding='utf-8')
    missing = [name for name in SCENARIO_NAMES if name not in text]
    assert not missing, f'{path} does not name {missing}'
